"""gpuevents.io/keep-until and gpuevents.io/exclude: each has an end; a malformed value (no end, no zone, not a
time, an end over a year ahead, unknown fields) is reported once and never taken as forever."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rules.lang.exemptions import EXCLUDE, KEEP_UNTIL, Exemptions, parse
from rules.lang.views import EvalClock, GpuView, JobView

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_keep_until_and_exclude_parse_with_their_ends_and_rules() -> None:
    found, bad = parse({KEEP_UNTIL: "2026-12-04T00:00:00Z",
                        EXCLUDE: "until=2026-12-31T00:00:00+01:00; rules=idle-gpu-2h, job-idle-1h"}, NOW)
    assert bad == []
    keep, excl = found
    assert keep.until == datetime(2026, 12, 4, tzinfo=UTC) and keep.rules is None
    assert excl.until == datetime(2026, 12, 30, 23, 0, tzinfo=UTC)
    assert excl.rules == frozenset({"idle-gpu-2h", "job-idle-1h"})
    assert excl.covers("idle-gpu-2h", NOW) and not excl.covers("other", NOW)
    assert not keep.covers("x", datetime(2026, 12, 4, tzinfo=UTC))  # ends at its end
    (bare,), _ = parse({EXCLUDE: "2026-12-05T00:00:00Z"}, NOW)
    assert bare.rules is None


def test_malformed_values_are_reported_and_not_taken() -> None:
    cases = {
        "forever": "not an RFC 3339 time",
        "rules=idle-gpu-2h": "no end",
        "2026-12-05T00:00:00": "no time zone",
        "until=2029-01-01T00:00:00Z": "more than 366 days ahead",
        "until=2026-12-05T00:00:00Z;users=bob": "unknown field",
    }
    for value, why in cases.items():
        found, bad = parse({EXCLUDE: value}, NOW)
        assert found == [] and len(bad) == 1 and why in bad[0].why, (value, bad)
    found, bad = parse({KEEP_UNTIL: "tomorrow"}, NOW)
    assert found == [] and "RFC 3339" in bad[0].why


def test_exemptions_cover_the_job_and_its_gpus_are_reported_once_and_expire() -> None:
    ex = Exemptions()
    new = ex.update("team-a/Deployment/llm", {KEEP_UNTIL: "2026-12-03T14:00:00Z", EXCLUDE: "forever"}, NOW)
    assert [m.annotation for m in new] == [EXCLUDE]
    assert ex.update("team-a/Deployment/llm", {KEEP_UNTIL: "2026-12-03T14:00:00Z", EXCLUDE: "forever"}, NOW) == []
    clock = EvalClock(NOW)
    job = JobView(clock, id="team-a/Deployment/llm")
    gpu = GpuView(clock, job="team-a/Deployment/llm", idle=True)
    other = GpuView(clock, job="team-b/Pod/x", idle=True)
    assert ex.for_view(job, "any-rule", NOW) is not None and ex.for_view(gpu, "any-rule", NOW) is not None
    assert ex.for_view(other, "any-rule", NOW) is None
    until = ex.until("team-a/Deployment/llm", NOW)
    assert until is not None and until.until == NOW + timedelta(hours=2)
    assert ex.expired(NOW + timedelta(hours=1)) == []
    assert ex.expired(NOW + timedelta(hours=2)) == ["team-a/Deployment/llm"]
    assert ex.for_view(job, "any-rule", NOW + timedelta(hours=2)) is None


async def test_status_shows_the_exemptions_and_the_malformed_ones() -> None:
    from io import StringIO

    from rich.console import Console

    from gpuevents.cli.client import exemptions_table
    from gpuevents.config import Config
    from gpuevents.costs import CostModel
    from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, SnapshotEvent
    from rules.core.core import Core
    from rules.engine.read.readmodel import build_read_model
    from rules.engine.read.status import summary_of
    from rules.lang.model import RuleSet

    core = Core(RuleSet())
    snap = NodeSnapshot(node=NodeInfo(name="n1", gpu_count=2), gpus=[GpuInfo(node="n1", index=0),
                                                                       GpuInfo(node="n1", index=1)], jobs=[
        JobInfo(id="a/Notebook/nb", scheduler="kubernetes", namespace="a", gpus=[0],
                annotations={KEEP_UNTIL: "2026-12-03T18:00:00Z"}),
        JobInfo(id="b/Deployment/d", scheduler="kubernetes", namespace="b", gpus=[1],
                annotations={EXCLUDE: "forever"})])
    core.step(SnapshotEvent(source="node/n1", time=NOW, data=snap), NOW)
    st = summary_of(await build_read_model(core, NOW, 0, CostModel(Config().costs)))
    assert [(e.job, e.until, e.malformed is not None) for e in st.exemptions] == [
        ("a/Notebook/nb", datetime(2026, 12, 3, 18, tzinfo=UTC), False), ("b/Deployment/d", None, True)]
    job = core.state.by_kind["job"]["job/kubernetes/a/Notebook/nb"].view
    assert job.exempt_until == datetime(2026, 12, 3, 18, tzinfo=UTC) and job.exemption.startswith(KEEP_UNTIL)
    from rules.engine.metrics import EngineMetrics

    metrics = EngineMetrics()
    metrics.observe_fleet(core)
    assert metrics.registry.get_sample_value("gpuevents_job_exemptions", {"state": "active"}) == 1
    assert metrics.registry.get_sample_value("gpuevents_job_exemptions", {"state": "malformed"}) == 1
    buf = StringIO()
    Console(file=buf, width=200, color_system=None).print(exemptions_table(st))
    text = buf.getvalue()
    assert "2026-12-03 18:00:00" in text and "every rule" in text and "not applied: not an RFC 3339 time" in text
