"""The pure core: edge thresholds with hysteresis, process events, snapshots, on virtual time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.core import GpuState, NodeCore, step_gpu
from agent.idlestate import IdleStateFile
from agent.inputs import NodeInputs
from agent.jobdetails import JobDetails
from agent.sample import GpuReading, NodeReading, ProcessIdentity, ProcReading, XidReading
from gpuevents.config import ThresholdsConfig
from gpuevents.events import (
    GpuEvent,
    GpuXidEvent,
    ProcessEvent,
    SnapshotEvent,
    decode_event,
    encode_event,
)

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
TH = ThresholdsConfig()


def gpu(util: float | None = 0.0, **kw: object) -> GpuReading:
    base: dict[str, object] = {"index": 0, "uuid": "GPU-0", "model": "H100", "util_pct": util,
                               "mem_used_mib": 1000.0, "mem_total_mib": 80000.0, "temp_c": 40.0}
    base.update(kw)
    return GpuReading(**base)  # type: ignore[arg-type]  # fields from a dict of overrides


def run(utils: list[float | None]) -> tuple[GpuState, list[tuple[int, str]]]:
    st = GpuState()
    seen: list[tuple[int, str]] = []
    for i, u in enumerate(utils):
        st, ev = step_gpu(st, gpu(u), T0 + timedelta(seconds=i), TH)
        seen.extend((i, e) for e in ev)
    return st, seen


def test_first_low_sample_starts_idle() -> None:
    st, seen = run([1.0])
    assert st.idle and st.idle_since == T0
    assert seen == [(0, "gpu.idle")]


def test_a_blip_does_not_end_idle() -> None:
    st, seen = run([0, 0, 90, 0, 0, 95, 97, 0])
    assert st.idle and st.idle_since == T0
    assert seen == [(0, "gpu.idle")]


def test_active_after_consecutive_busy_samples() -> None:
    st, seen = run([0, 0, 90, 91, 92, 93])
    assert seen == [(0, "gpu.idle"), (4, "gpu.active")]
    assert not st.idle and st.idle_since is None


def test_busy_gpu_that_drops_goes_idle_at_once() -> None:
    st, seen = run([90, 90, 3])
    assert seen == [(2, "gpu.idle")]
    assert st.idle_since == T0 + timedelta(seconds=2)


def test_unknown_utilization_is_no_evidence() -> None:
    st, seen = run([0, None, None, 0])
    assert st.idle and st.idle_since == T0 and seen == [(0, "gpu.idle")]
    st, seen = run([None, None])
    assert not st.idle and seen == []


def test_hot_fires_once_and_rearms_below_clear() -> None:
    st = GpuState()
    temps = [70, 86, 90, 82, 79, 86]
    seen: list[tuple[int, str]] = []
    for i, t in enumerate(temps):
        st, ev = step_gpu(st, gpu(95, temp_c=float(t)), T0 + timedelta(seconds=i), TH)
        seen.extend((i, e) for e in ev)
    assert seen == [(1, "gpu.hot"), (5, "gpu.hot")]


def test_memory_full_fires_once_until_usage_falls() -> None:
    st = GpuState()
    seen: list[tuple[int, str]] = []
    for i, used in enumerate([70000, 77000, 79000, 75000, 70000, 77000]):
        st, ev = step_gpu(st, gpu(95, mem_used_mib=float(used)), T0 + timedelta(seconds=i), TH)
        seen.extend((i, e) for e in ev)
    assert seen == [(1, "gpu.memory_full"), (5, "gpu.memory_full")]


def test_lost_gpu_event_once() -> None:
    st, ev = step_gpu(GpuState(idle=True, idle_since=T0), gpu(lost=True), T0, TH)
    assert ev == ("gpu.lost",) and st.lost and not st.idle
    st, ev = step_gpu(st, gpu(lost=True), T0, TH)
    assert ev == ()


# ---------------------------------------------------------------- node core
def ident(pid: int, user: str, age_s: float, owner: str | None = None) -> ProcessIdentity:
    return ProcessIdentity(pid=pid, create_time=T0 - timedelta(seconds=age_s), name="python",
                           cmdline=f"python train.py --run {pid}", user=user, uid=1000,
                           owner=owner, pod="ml/job-1", labels={"team": "nlp"})


def core(**kw: object) -> NodeCore:
    return NodeCore(node="n1", cluster="c1", thresholds=TH, snapshot_interval_s=15,
                    labels={"env": "dev"}, driver_version="550.54.15", hostname="host-1", **kw)  # type: ignore[arg-type]  # keyword overrides


def reading(procs: list[ProcReading], utils: tuple[float, float] = (0.0, 95.0),
            xids: tuple[XidReading, ...] = ()) -> NodeReading:
    return NodeReading(
        gpus=(gpu(utils[0], index=0, uuid="GPU-a"), gpu(utils[1], index=1, uuid="GPU-b", temp_c=60.0)),
        procs=tuple(procs), xids=xids,
    )


def test_snapshot_carries_the_whole_node() -> None:
    c = core()
    ids = {10: ident(10, "alice", 3600, owner="alice@example.com"), 11: ident(11, "bob", 60),
           12: ident(12, "carol", 7200)}
    procs = [ProcReading(10, 0, 20000.0, 0.0), ProcReading(11, 0, 1000.0, 0.0),
             ProcReading(12, 1, 50000.0, 80.0), ProcReading(12, 0, 10.0, 0.0)]
    events = c.step(T0, reading(procs), ids)
    snaps = [e for e in events if isinstance(e, SnapshotEvent)]
    assert len(snaps) == 1
    s = decode_event(encode_event(snaps[0]))  # what the engine reads back
    assert isinstance(s, SnapshotEvent)
    assert s.source == "node/n1" and s.cluster == "c1" and s.time == T0
    n = s.data.node
    assert (n.name, n.cluster, n.labels, n.gpu_count, n.gpus_idle, n.gpus_busy, n.driver_version) == (
        "n1", "c1", {"env": "dev"}, 2, 1, 1, "550.54.15")
    g0, g1 = s.data.gpus
    assert g0.idle and g0.idle_since == T0 and g0.idle_for_s == 0
    assert g0.pids == [12, 10, 11]  # oldest first
    assert g0.owners == ["carol", "alice@example.com", "bob"] and g0.owner == "carol"
    assert g0.mem_pct == 1.25 and g0.uuid == "GPU-a"
    assert not g1.idle and g1.pids == [12]
    p12 = next(p for p in s.data.processes if p.pid == 12)
    assert p12.gpus == [0, 1] and p12.gpu_mem_mib == 50010.0 and p12.gpu_util_pct == 40.0
    assert p12.age_s == 7200 and p12.user == "carol" and p12.pod == "ml/job-1"
    assert p12.labels == {"team": "nlp"} and p12.node == "n1"


def test_events_in_order_process_started_before_gpu_idle() -> None:
    c = core()
    events = c.step(T0, reading([ProcReading(10, 0, 100.0, 0.0)]), {10: ident(10, "alice", 5)})
    types = [e.type for e in events]
    assert types == ["process.started", "gpu.idle", "node.snapshot"]
    idle = events[1]
    assert isinstance(idle, GpuEvent) and idle.data.index == 0 and idle.data.pids == [10]
    assert idle.data.owner == "alice"


def test_snapshot_every_interval_only() -> None:
    c = core()
    types = []
    for i in range(31):
        types += [e.type for e in c.step(T0 + timedelta(seconds=i), reading([]), {})]
    assert types.count("node.snapshot") == 3  # at 0s, 15s and 30s


def test_process_ended_and_reused_pid_is_a_new_process() -> None:
    c = core()
    c.step(T0, reading([ProcReading(10, 0, 100.0, 0.0)]), {10: ident(10, "alice", 5)})
    reused = ProcessIdentity(pid=10, create_time=T0 + timedelta(seconds=1), name="python", user="bob")
    events = c.step(T0 + timedelta(seconds=2), reading([ProcReading(10, 0, 100.0, 0.0)]), {10: reused})
    got = [(e.type, e.data.user) for e in events if isinstance(e, ProcessEvent)]
    assert got == [("process.started", "bob"), ("process.ended", "alice")]
    events = c.step(T0 + timedelta(seconds=3), reading([]), {})
    assert [(e.type, e.data.user) for e in events if isinstance(e, ProcessEvent)] == [("process.ended", "bob")]


def test_a_pid_without_identity_is_skipped() -> None:
    c = core()
    events = c.step(T0, reading([ProcReading(10, 0, 100.0, 0.0)]), {})
    assert not [e for e in events if isinstance(e, ProcessEvent)]
    assert c.snapshot(T0).gpus[0].pids == []


def test_xid_event_carries_the_gpu() -> None:
    c = core()
    events = c.step(T0, reading([], xids=(XidReading(gpu=1, xid=79),)), {})
    xid = next(e for e in events if isinstance(e, GpuXidEvent))
    assert xid.data.xid == 79 and xid.data.index == 1 and xid.data.uuid == "GPU-b"


def test_holds_gpu_checks_create_time() -> None:
    c = core()
    c.step(T0, reading([ProcReading(10, 0, 100.0, 0.0)]), {10: ident(10, "alice", 5)})
    assert c.holds_gpu(10, T0 - timedelta(seconds=5))
    assert c.holds_gpu(10, T0 - timedelta(seconds=5.5))
    assert not c.holds_gpu(10, T0 - timedelta(seconds=50))
    assert not c.holds_gpu(11, T0 - timedelta(seconds=5))


def test_an_agent_restart_carries_the_idle_clock_of_a_gpu_still_idle(tmp_path: Path) -> None:
    before = core()
    before.step(T0, reading([]), {})  # GPU-a idle since T0, GPU-b busy
    file = IdleStateFile(tmp_path, "n1")
    file.save(T0 + timedelta(hours=2), before.idle_clocks())
    assert before.idle_clocks() == {"GPU-a": T0}

    after = core()  # the restarted agent, two hours and a minute later
    now = T0 + timedelta(hours=2, minutes=1)
    after.carry_idle(file.load(now, timedelta(minutes=5)))
    events = after.step(now, reading([], utils=(0.0, 0.0)), {})
    snap = next(e for e in events if isinstance(e, SnapshotEvent)).data
    by_uuid = {g.uuid: g for g in snap.gpus}
    assert by_uuid["GPU-a"].idle_since == T0  # not reset to the restart: the idle rule keeps its two hours
    assert by_uuid["GPU-b"].idle_since == now  # it was busy before: its clock starts now
    assert not [e for e in events if e.type == "gpu.idle" and e.data.uuid == "GPU-a"]


def test_idle_clocks_are_not_carried_when_the_file_is_old_or_the_gpu_is_busy(tmp_path: Path) -> None:
    file = IdleStateFile(tmp_path, "n1")
    file.save(T0, {"GPU-a": T0 - timedelta(hours=1)})
    assert file.load(T0 + timedelta(minutes=10), timedelta(minutes=5)) == {}  # too old: unknown meanwhile
    assert IdleStateFile(tmp_path, "other").load(T0, timedelta(minutes=5)) == {}
    (tmp_path / "idle-n1.json").write_text("{not json")
    assert file.load(T0, timedelta(minutes=5)) == {}
    after = core()
    after.carry_idle({"GPU-a": T0 - timedelta(hours=1)})
    after.step(T0, reading([], utils=(90.0, 90.0)), {})
    assert after.idle_clocks() == {}


H100_BY_SM = ThresholdsConfig.model_validate(
    {"idle_by_model": [{"model": "*H100*", "signal": "sm_active", "below": 3, "power_below_w": 150}]})


def test_a_model_s_own_signal_decides_idleness_with_the_same_hysteresis() -> None:
    core = NodeCore(node="n1", cluster="c1", thresholds=H100_BY_SM, snapshot_interval_s=15)
    # util says busy (a spinning kernel) but the SMs are idle and power is low: idle by sm_active
    steps = [(98.0, 1.0, 120.0), (98.0, 90.0, 400.0), (98.0, 1.0, 120.0), (98.0, 80.0, 400.0),
             (98.0, 85.0, 410.0), (98.0, 88.0, 420.0)]
    seen: list[tuple[int, str]] = []
    for i, (u, sm, p) in enumerate(steps):
        r = gpu(u, model="NVIDIA H100 80GB HBM3", sm_active_pct=sm, power_w=p)
        seen += [(i, e.type) for e in core.step(T0 + timedelta(seconds=i), NodeReading(gpus=(r,)), {})
                 if e.type.startswith("gpu.")]
    assert seen == [(0, "gpu.idle"), (5, "gpu.active")]  # one blip did not end it; three busy samples did


def test_power_as_second_signal_keeps_a_low_util_gpu_busy() -> None:
    core = NodeCore(node="n1", cluster="c1", thresholds=H100_BY_SM, snapshot_interval_s=15)
    r = gpu(0.0, model="NVIDIA H100 80GB HBM3", sm_active_pct=0.5, power_w=300.0)  # loading weights
    core.step(T0, NodeReading(gpus=(r,)), {})
    assert not core.gpu_states[0].idle


def test_other_models_keep_the_utilization_threshold() -> None:
    core = NodeCore(node="n1", cluster="c1", thresholds=H100_BY_SM, snapshot_interval_s=15)
    r = gpu(2.0, model="NVIDIA A100-SXM4-80GB", sm_active_pct=None, power_w=300.0)
    core.step(T0, NodeReading(gpus=(r,)), {})
    assert core.gpu_states[0].idle


def test_without_the_signal_s_reading_idleness_stays_as_it_was() -> None:
    core = NodeCore(node="n1", cluster="c1", thresholds=H100_BY_SM, snapshot_interval_s=15)
    core.step(T0, NodeReading(gpus=(gpu(0.0, model="H100", sm_active_pct=0.0, power_w=80.0),)), {})
    for i in range(1, 5):  # GPM read failed: no evidence, so no gpu.active
        core.step(T0 + timedelta(seconds=i), NodeReading(gpus=(gpu(99.0, model="H100", power_w=400.0),)), {})
    assert core.gpu_states[0].idle and core.gpu_states[0].idle_since == T0


def test_gpm_activity_reaches_the_snapshot_and_the_last_xid_is_kept() -> None:
    core = NodeCore(node="n1", cluster="c1", thresholds=TH, snapshot_interval_s=15)
    r = gpu(60.0, sm_active_pct=42.5, tensor_active_pct=20.0)
    events = core.step(T0, NodeReading(gpus=(r,), xids=(XidReading(gpu=0, xid=79),)), {})
    snap = next(e for e in events if isinstance(e, SnapshotEvent))
    decoded = decode_event(encode_event(snap))
    assert isinstance(decoded, SnapshotEvent)
    g = decoded.data.gpus[0]
    assert (g.sm_active_pct, g.tensor_active_pct) == (42.5, 20.0)
    assert core.last_xid == {0: 79}


def test_the_hpc_job_mapping_allocates_gpus_and_lists_the_jobs_with_their_processes() -> None:
    c = core()
    mapped = NodeInputs(job_gpus={"0": ["4242"], "7": ["999"]})  # GPU 7 is not on this node: ignored
    ident_in_job = ProcessIdentity(pid=100, create_time=T0 - timedelta(hours=1), user="erin", job="4242")
    events = c.step(T0, reading([ProcReading(pid=100, gpu=0, mem_mib=100.0, sm_util_pct=0.0)]), {100: ident_in_job},
                    mapped)
    snap = next(e for e in events if isinstance(e, SnapshotEvent)).data
    by_index = {g.index: g for g in snap.gpus}
    assert (by_index[0].allocated, by_index[0].job) == (True, "4242")
    assert (by_index[1].allocated, by_index[1].job) == (False, None)
    [job] = snap.jobs
    assert (job.id, job.user, job.gpus, job.pids) == ("4242", "erin", [0], [100])
    events = c.step(T0 + timedelta(seconds=15), reading([]), {}, NodeInputs(job_gpus=None))
    snap = next(e for e in events if isinstance(e, SnapshotEvent)).data
    assert snap.jobs == [] and all(g.allocated is None for g in snap.gpus)


def test_a_job_with_nothing_on_its_gpu_carries_the_schedulers_details() -> None:
    c = core()
    details = {"77": JobDetails(user="alice", account="physics", partition="gpu", qos="normal", name="train",
                                started_at=T0 - timedelta(hours=1), time_limit_s=7200)}
    inputs = NodeInputs(job_gpus={"0": ["77"], "1": ["78"]}, job_details=details.get)
    ids = {12: ident(12, "carol", 60)}
    snap = c.snapshot(T0) if c.step(T0, reading([ProcReading(12, 1, 10.0, 90.0)]), ids, inputs) else None
    assert snap is not None
    by_id = {j.id: j for j in snap.jobs}
    j = by_id["77"]
    assert (j.user, j.account, j.partition, j.qos, j.name, j.time_limit_s) == (
        "alice", "physics", "gpu", "normal", "train", 7200)
    assert j.pids == [] and j.started_at == T0 - timedelta(hours=1)
    # no details known: the user its processes run as, nothing else guessed
    assert (by_id["78"].user, by_id["78"].partition, by_id["78"].qos) == (None, None, None)
