"""Job summaries in the usage store: written as jobs run and end, kept across an engine restart, added to a
store from before they existed, and read back by `gpuevents job` / `gpuevents jobs`; their p95 utilization, SM
activity and memory (shown with the peak, used for the slice a job would have fitted, which still holds its peak
memory plus headroom); simulated summaries marked and never written over a real job's."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpuevents.cli import app
from gpuevents.cli.jobs import describe
from gpuevents.config import Config, CostsConfig
from gpuevents.costs import CostModel
from gpuevents.events import JobInfo
from gpuevents.mig import profiles_of
from rules.core.state.jobs import SUMMARY_FIELDS
from rules.usage.fits import MEM_STEP
from rules.usage.jobledger import JobLedger
from rules.usage.jobstore import JobStore, ended_event, summary_of
from rules.usage.recorder import UsageRecorder
from rules.usage.rightsize import HEADROOM
from rules.usage.store import UsageStore
from tests.rules.usage.test_jobledger import T0, job, snap

COSTS = CostModel(CostsConfig())
H100 = "NVIDIA H100 80GB HBM3"


def config(tmp_path: Path) -> Config:
    return Config.model_validate({"engine": {"usage_db": str(tmp_path / "usage.sqlite")},
                                  "agent": {"snapshot_interval": "1m"}})


async def test_a_running_job_survives_a_restart_and_its_summary_is_complete_when_it_ends(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
    rec = UsageRecorder.from_config(config(tmp_path))
    for m in range(31):  # 30 minutes at 20 %
        at = now + timedelta(minutes=m)
        rec.observe(snap("n1", at, [20, 20], [job([0, 1], name="train")], mem=30000), at)
    await rec.flush(now + timedelta(minutes=30))
    rec.close()

    rec = UsageRecorder.from_config(config(tmp_path))  # the engine restarts
    assert [t.id for t in rec.ledger.jobs.values()] == ["42"]
    for m in range(31, 61):  # another 30 minutes, idle
        at = now + timedelta(minutes=m)
        rec.observe(snap("n1", at, [0, 0], [job([0, 1], name="train")]), at)
    end = now + timedelta(minutes=61)
    rec.observe(snap("n1", end, [0, 0], []), end)
    await rec.flush(end)
    rec.close()

    result = CliRunner().invoke(app, ["job", "42", "--json", "-c", str(write_config(tmp_path))])
    assert result.exit_code == 0, result.output
    [s] = json.loads(result.output)
    assert s["running"] is False and s["user"] == "alice" and s["partition"] == "gpu" and s["name"] == "train"
    assert s["gpu_count"] == 2
    # the minute across the restart is not counted (no sample of it in the new engine)
    assert s["gpu_hours"] == 2.0
    assert s["mean_util_pct"] == 10  # 20 % for half its time, 0 % for the other half
    assert s["peak_util_pct"] == 20 and s["peak_mem_mib"] == 30000
    assert s["idle_share_pct"] == 50
    assert s["mean_sm_active_pct"] is None  # not measured
    # peak 30,000 MiB + 20 % and peak 20 % + 20 % of the SMs: 3 of the H100's 7 slices, 40 GB
    assert s["smaller_fit"] == "MIG 3g.40gb"
    assert s["cost"] > 0

    text = CliRunner().invoke(app, ["job", "42", "-c", str(write_config(tmp_path))])
    assert "Job 42 (slurm, train): ended" in text.output and "of 2 GPU(s)" in text.output
    assert "MIG 3g.40gb" in text.output


def test_a_store_from_before_job_summaries_gains_the_table_and_keeps_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "usage.sqlite"
    with UsageStore(db) as store:
        assert store.usage(0, 2**40) == []
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE IF EXISTS job_summaries")  # as an older engine left it
    conn.execute("INSERT INTO usage (hour, cluster, node, gpu, owner, team) VALUES (3600, 'c', 'n', 0, 'a', 't')")
    conn.commit()
    conn.close()
    rec = UsageRecorder.from_config(config(tmp_path))
    rec.close()
    with UsageStore(db) as store:
        assert len(store.usage(0, 2**40)) == 1
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"usage", "idle_jobs", "job_summaries"} <= tables


def write_config(tmp_path: Path) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(f"engine: {{usage_db: {tmp_path / 'usage.sqlite'}}}\n")
    return p


async def test_a_job_exempt_by_annotation_is_in_the_weekly_report_with_its_end(tmp_path: Path) -> None:
    now = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    until = (now + timedelta(days=2)).isoformat().replace("+00:00", "Z")
    kept = JobInfo(id="team-a/Deployment/chat", scheduler="kubernetes", user="carol", namespace="team-a", gpus=[0],
                   annotations={"gpuevents.io/keep-until": until})
    sloppy = JobInfo(id="team-a/Deployment/notebook", scheduler="kubernetes", user="dave", namespace="team-a",
                     gpus=[1], annotations={"gpuevents.io/exclude": "forever"})
    rec = UsageRecorder.from_config(config(tmp_path))
    for m in range(61):
        at = now + timedelta(minutes=m)
        rec.observe(snap("n1", at, [0, 0], [kept, sloppy]), at)
    await rec.flush(now + timedelta(minutes=60))
    rec.close()

    report = json.loads(CliRunner().invoke(app, ["report", "--format", "json", "-c",
                                                 str(write_config(tmp_path))]).output)
    lines = {x["job"]: x for x in report["exemptions"]}
    chat = lines["job/kubernetes/team-a/Deployment/chat"]
    assert chat["exemption"] == f"gpuevents.io/keep-until: {until}" and chat["user"] == "carol"
    assert datetime.fromisoformat(chat["until"]) == datetime.fromisoformat(until.replace("Z", "+00:00"))
    assert chat["idle_share_pct"] == 100 and chat["gpu_hours"] == 1.0
    notebook = lines["job/kubernetes/team-a/Deployment/notebook"]
    assert notebook["exemption"].startswith("malformed gpuevents.io/exclude") and notebook["until"] is None
    md = CliRunner().invoke(app, ["report", "--format", "md", "-c", str(write_config(tmp_path))]).output
    assert "## Exempt by annotation" in md and "keep-until" in md


def _run(minutes: Sequence[tuple[float, float, float | None]]) -> JobLedger:
    """A one-GPU job on an H100, one snapshot a minute: (utilization, memory MiB, SM activity) each minute."""
    ledger = JobLedger(max_gap_s=600)
    for m, (util, mem, sm) in enumerate(minutes):
        ledger.observe(snap("n1", T0 + timedelta(minutes=m), [util], [job([0])], mem=mem, sm=sm))
    ledger.observe(snap("n1", T0 + timedelta(minutes=len(minutes)), [0], []))
    return ledger


def test_a_job_with_a_short_spike_gets_its_p95_not_its_peak_and_a_slice_from_p95_compute() -> None:
    # two hours at 10 % and 6 GB, five minutes at 95 % and 30 GB: the peak would keep the whole GPU
    minutes = [(10.0, 6000.0, 8.0)] * 115 + [(95.0, 30000.0, 90.0)] * 5
    [t] = _run(minutes).drain(T0 + timedelta(minutes=121))
    s = summary_of(t, COSTS)
    assert s.peak_util_pct == 95 and s.p95_util_pct == 15  # the upper edge of the 10-15 % bin
    assert s.p95_sm_active_pct == 10
    assert s.peak_mem_mib == 30000 and s.p95_mem_mib is not None and 6000 <= s.p95_mem_mib <= 6000 * MEM_STEP
    # p95 SM 10 % + 20 % → 1 of 7 slices; peak 30,000 MiB + 20 % → the slice with 40 GB: 1g.20gb would not hold it
    assert s.smaller_fit == "MIG 3g.40gb"
    text = describe(s, COSTS)
    assert "util       mean 14 %   p95 15 %   peak 95 %" in text
    assert "SM active  mean 11 %   p95 10 %" in text and "memory     p95 6.2 GiB   peak 29.3 GiB" in text

    event = ended_event(s, COSTS)
    assert event.data.p95_util_pct == 15 and event.data.p95_mem_mib == s.p95_mem_mib
    assert {"p95_util_pct", "p95_sm_active_pct", "p95_mem_mib"} <= set(SUMMARY_FIELDS)


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=100), st.floats(min_value=0, max_value=80_000),
                          st.none() | st.floats(min_value=0, max_value=100)), min_size=2, max_size=60))
def test_the_slice_a_job_would_have_fitted_always_holds_its_peak_memory_plus_headroom(
        minutes: list[tuple[float, float, float | None]]) -> None:
    [t] = _run(minutes).drain(T0 + timedelta(minutes=len(minutes) + 1))
    s = summary_of(t, COSTS)
    if s.smaller_fit is None:
        return
    profile = next(p for p in profiles_of(H100) if f"MIG {p.name}" == s.smaller_fit)
    assert profile.memory_mib >= max(m for _u, m, _s in minutes) * (1 + HEADROOM)
    compute = max(s.p95_sm_active_pct or 0, 0) if s.p95_sm_active_pct is not None else s.p95_util_pct or 0
    assert profile.compute_share >= compute / 100 * (1 + HEADROOM)


def test_the_histograms_survive_the_store_so_a_resumed_job_keeps_its_spread() -> None:
    minutes = [(10.0, 6000.0, None)] * 30
    ledger = JobLedger(max_gap_s=600)
    for m, (util, mem, sm) in enumerate(minutes):
        ledger.observe(snap("n1", T0 + timedelta(minutes=m), [util], [job([0])], mem=mem, sm=sm))
    [running] = ledger.drain(T0 + timedelta(minutes=30))
    with JobStore(":memory:") as store:
        store.put([running], COSTS)
        [back] = store.running()
        assert back.util_hist == running.util_hist and back.mem_hist == running.mem_hist and back.sm_hist == {}
        [s] = store.find("42")
    # a steady job: its p95 is its peak (a bin's edge is capped there)
    assert s.p95_util_pct == 10 and s.p95_sm_active_pct is None and s.p95_mem_mib == 6000


def test_simulated_summaries_never_overwrite_a_job_seen_on_the_fleet_and_are_marked() -> None:
    ledger = _run([(50.0, 9000.0, None)] * 90)
    [real] = ledger.drain(T0 + timedelta(minutes=91))
    [sim] = _run([(5.0, 100.0, None)] * 10).drain(T0 + timedelta(minutes=11))
    sim.simulated = True
    with JobStore(":memory:") as store:
        store.put([real], COSTS)
        assert store.put_new([sim], COSTS) == 0  # the same id: the fleet's job stays
        [s] = store.find("42")
        assert s.simulated is False and s.peak_util_pct == 50
        sim.id = "43"
        assert store.put_new([sim], COSTS) == 1 and store.put_new([sim], COSTS) == 0
        [s] = store.find("43")
        assert s.simulated is True
    text = describe(s, COSTS)
    assert "[SIMULATED" in text and "smaller fit not assessed: too little data" in text
