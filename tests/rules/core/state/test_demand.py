"""The demand book: a report replaces its scheduler's last, goes stale after `valid_for_s`, and an entity reads
its partition's figure before its pool's and its model's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpuevents.events import SCHEDULER_SOURCE, DemandEntry, DemandEvent, DemandReport
from rules.core.state.demand import DemandBook
from rules.lang.views import EvalClock

T0 = datetime(2026, 1, 5, 9, tzinfo=UTC)


def report(at: datetime, *entries: DemandEntry, scheduler: str = "slurm", valid: float | None = 90) -> DemandEvent:
    return DemandEvent(source=f"node/{SCHEDULER_SOURCE}", cluster="c1", time=at,
                       data=DemandReport(scheduler=scheduler, entries=list(entries), valid_for_s=valid))


def test_a_report_replaces_the_last_and_goes_stale_when_its_reader_stops() -> None:
    clock = EvalClock(T0)
    book = DemandBook(clock)
    book.apply(report(T0, DemandEntry(partition="gpu", pending_gpus=4, waiting_since=T0 - timedelta(minutes=5))))
    assert book.lookup("c1", "gpu", None, None) == (4, (T0 - timedelta(minutes=5)).timestamp(), 0)
    book.apply(report(T0, DemandEntry(partition="gpu", pending_gpus=1)))
    assert book.lookup("c1", "gpu", None, None)[0] == 1
    clock.set(T0 + timedelta(seconds=91))
    assert book.lookup("c1", "gpu", None, None) == (0, None, 0)  # stale: says nothing
    assert book.lookup("other", "gpu", None, None) == (0, None, 0)


def test_the_partition_comes_before_the_pool_and_the_model_and_schedulers_add_up() -> None:
    book = DemandBook(EvalClock(T0))
    book.apply(report(T0, DemandEntry(partition="gpu", pending_gpus=2), DemandEntry(model="a100", pending_gpus=5),
                      DemandEntry(pending_gpus=7)))
    book.apply(report(T0, DemandEntry(pool="h100", pending_gpus=3), DemandEntry(model="a100", pending_gpus=1),
                      DemandEntry(pending_gpus=4), scheduler="kubernetes"))
    assert book.lookup("c1", "gpu", "h100", "a100")[0] == 2
    assert book.lookup("c1", "bigmem", "h100", "a100")[0] == 3
    assert book.lookup("c1", None, None, "a100")[0] == 6
    assert book.lookup("c1", None, None, "h100") == (0, None, 11)
