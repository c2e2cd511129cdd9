"""One GPU and one process: the engine's reading (gpuevents/events.py `GpuInfo`, `ProcessInfo`) is the definition;
the wire's Structs, the rules' views, the fleet summary and the rule-test input are held against it here, so a
field added to the reading fails this test until every form that derives from it says what it does with it."""

from __future__ import annotations

from typing import Any

import msgspec

from gpuevents import agentdata
from gpuevents.events import GpuInfo, ProcessInfo
from gpuevents.wire.fleet import FleetGpu
from rules.lang.views import GpuView, ProcessView
from rules.offline import testfile

GPU = set(GpuInfo.model_fields)
PROCESS = set(ProcessInfo.model_fields)


def _public(cls: type[GpuView | ProcessView]) -> set[str]:
    return {k for k in cls.__slots__ if not k.startswith("_")}


def test_the_wire_structs_are_the_reading() -> None:
    assert [f.name for f in msgspec.structs.fields(agentdata.GpuInfo)] == list(GpuInfo.model_fields)
    assert [f.name for f in msgspec.structs.fields(agentdata.ProcessInfo)] == list(ProcessInfo.model_fields)


def test_the_views_show_the_reading_with_times_measured_when_evaluated() -> None:
    # `idle_for_s` and `age_s` are properties measured at evaluation time; `id` and `processes` are the view's own
    assert _public(GpuView) == GPU - {"idle_for_s"} | {"id", "processes"}
    assert _public(ProcessView) == PROCESS - {"age_s"} | {"id"}
    for view in (GpuView, ProcessView):  # the names are listed twice there: slots and annotations
        assert set(view.__annotations__) == _public(view)
    assert isinstance(GpuView.idle_for_s, property) and isinstance(ProcessView.age_s, property)


def test_the_fleet_summary_shows_reading_fields_and_says_which_it_derives() -> None:
    derived = {"held_idle", "processes", "cost_per_hour", "team"}
    assert set(FleetGpu.model_fields) - derived <= GPU
    for name in set(FleetGpu.model_fields) - derived:
        assert FleetGpu.model_fields[name].annotation == GpuInfo.model_fields[name].annotation, name


def test_a_rule_test_sets_every_reading_field_but_those_it_derives() -> None:
    # node: the snapshot's; idle_since and idle_for_s: from `idle_for`; owners, owner: the processes';
    # allocated and job: the snapshot's `jobs`; xid_at: an offset from the test's start, as `at` is
    from_elsewhere = {"node", "idle_since", "idle_for_s", "owners", "owner", "allocated", "job"}
    offsets = {"xid_at"}
    assert set(testfile.TestGpu.model_fields) == GPU - from_elsewhere | {"idle_for"}
    # node: the snapshot's; age_s: from `age` or `create_time`
    assert set(testfile.TestProcess.model_fields) == PROCESS - {"node", "age_s"} | {"age"}
    for test, reading in ((testfile.TestGpu, GpuInfo), (testfile.TestProcess, ProcessInfo)):
        for name in set(test.model_fields) & set(reading.model_fields) - offsets:
            want: Any = reading.model_fields[name].annotation
            got: Any = test.model_fields[name].annotation
            # a rule test may leave out a reading the agent always sends (util, memory: 0), and what is derived
            # when it does (`idle`: the thresholds judge it; `create_time`: from `age`, or the first sight)
            loosened = (want == float | None and got is float) or (name in ("idle", "create_time")
                                                                   and got == want | None)
            assert got == want or loosened, (test.__name__, name, got, want)
