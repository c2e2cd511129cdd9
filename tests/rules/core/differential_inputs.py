"""Random inputs for the differential test: every item kind the core accepts, on every entity kind.

Nodes (two clusters) send snapshots that change, repeat byte for byte or as equal copies, with GPUs that have
owners and no processes, Slurm and Kubernetes jobs across nodes (Kubernetes ones with `gpuevents.io/keep-until`
and `gpuevents.io/exclude` annotations that end, or are malformed), processes in jobs; threshold, XID, process
and agent events; demand reports and `job.ended`; snoozes and keeps of every entity kind; ticks (with the sweep
done in place or left to `Sweep` slices); forgotten nodes; action outcomes of the warnings sent; and reloads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import msgspec
from hypothesis import strategies as st

from gpuevents.events import (
    SCHEDULER_SOURCE,
    AgentInfo,
    DemandEntry,
    DemandEvent,
    DemandReport,
    GpuInfo,
    GpuXid,
    JobEnded,
    JobEndedEvent,
    JobInfo,
    ProcessInfo,
    SnapshotEvent,
    make_event,
)
from rules.core.core import CoreInput, ForgetNode, Snooze, Sweep, Tick
from rules.lang.exemptions import EXCLUDE, KEEP_UNTIL
from tests.rules.helpers import T0, at, gpu, proc, snapshot, with_data

NODES = ["n1", "n2", "n3"]
CLUSTER = {"n1": "default", "n2": "default", "n3": "east"}  # n3 is another cluster's: its keys are `east:n3/...`
KEYS = {n: n if c == "default" else f"{c}:{n}" for n, c in CLUSTER.items()}
OWNERS: list[list[str]] = [[], ["alice"], ["carol"], ["carol", "alice"]]
KUBE = "ml/Deployment/chat"
ANNOTATIONS: list[dict[str, str]] = [
    {}, {KEEP_UNTIL: at(200).isoformat()}, {KEEP_UNTIL: at(900).isoformat()}, {KEEP_UNTIL: "tomorrow"},
    {EXCLUDE: f"until={at(600).isoformat()};rules=idle-long,job-idle-for,kube-idle"},
    {EXCLUDE: at(3000).isoformat()}, {EXCLUDE: "rules=idle-long"},
]
JOB_IDS = ["7", "8", KUBE, None]
JOB_KEYS = ["job/slurm/7", "job/slurm/8", f"job/kubernetes/{KUBE}"]


@dataclass(frozen=True)
class Reload:
    """Replace the rules with variant `variant` (see the test's `RULE_SETS`)."""

    variant: int


@dataclass(frozen=True)
class Outcome:
    """The runner's outcome of a warning an open incident sent: the `index`-th known one (if any)."""

    index: int
    outcome: str


Item = CoreInput | Reload | Outcome


def _kube(draw: st.DrawFn, gpus: list[int]) -> JobInfo:
    return JobInfo(id=KUBE, scheduler="kubernetes", namespace="ml", name="chat", controller="Deployment/chat",
                   user=draw(st.sampled_from([None, "dave"])), gpus=gpus, pods=["chat-1"],
                   annotations=draw(st.sampled_from(ANNOTATIONS)))


def _jobs(draw: st.DrawFn) -> list[JobInfo]:
    shape = draw(st.integers(0, 4))
    if shape == 0:
        return []
    if shape == 1:
        return [JobInfo(id="7", user="erin", gpus=[0, 1])]
    if shape == 2:
        return [JobInfo(id="7", user="erin", gpus=[0]), JobInfo(id="8", user="bob", gpus=[1, 2], partition="p")]
    if shape == 3:
        return [_kube(draw, [0, 1])]
    return [JobInfo(id="7", user="erin", gpus=[0]), _kube(draw, [1, 2])]


@st.composite
def _gpu(draw: st.DrawFn, index: int) -> GpuInfo:
    state = draw(st.integers(0, 2))  # busy, idle and held, idle and free
    noise = draw(st.integers(0, 2))
    idle_for = draw(st.sampled_from([None, None, 100.0, 400.0])) if state else None
    since = draw(st.sampled_from([T0, None])) if state else None
    return gpu(index, 0.0 if state else 90.0 + noise, temp_c=draw(st.sampled_from([50.0, 50.0, 95.0])) + noise,
               power_w=80.0 + 110 * noise, idle_since=since, idle_for_s=idle_for,
               pids=[40 + index] if state != 2 and draw(st.booleans()) else [], owners=draw(st.sampled_from(OWNERS)),
               model=draw(st.sampled_from([None, "H100"])))


def _procs(draw: st.DrawFn, n: int) -> list[ProcessInfo]:
    ppid = draw(st.sampled_from([1, 7]))
    user = draw(st.sampled_from(["alice", "carol"]))
    job = draw(st.sampled_from(JOB_IDS))
    return [proc(40 + i, user=user, gpus=[i], ppid=ppid, created=T0 - timedelta(minutes=5), job=job)
            for i in range(n)]


def _snooze(draw: st.DrawFn, node: str, t: float) -> Snooze:
    kind = draw(st.sampled_from(["gpu", "gpu", "node", "process", "job"]))
    rule = draw(st.sampled_from({
        "gpu": ["held-idle", "hot", "alice-busy", "idle-long", "kube-idle", "wanted"],
        "node": ["half-idle", "agent-down"], "process": ["ghost", "old", "in-job"],
        "job": ["spread-idle", "job-idle-for", "job-kept"]}[kind]))
    key = KEYS[node]
    entity = {"gpu": f"{key}/gpu{draw(st.integers(0, 2))}", "node": key,
              "process": f"{key}/pid{40 + draw(st.integers(0, 2))}", "job": draw(st.sampled_from(JOB_KEYS))}[kind]
    until = at(t + draw(st.sampled_from([-1.0, 30.0, 200.0, 100_000.0])))
    return Snooze(rule=rule, entity_id=entity, until=until, by="alice", bounded=draw(st.booleans()))


KINDS = ["snap", "snap", "snap", "repeat", "repeat", "copy", "tick", "tick", "gpu", "xid", "proc", "stop",
         "start", "forget", "snooze", "sweep", "demand", "ended", "outcome", "reload"]


@st.composite
def inputs(draw: st.DrawFn) -> list[tuple[float, Item]]:
    out: list[tuple[float, Item]] = []
    last: dict[str, SnapshotEvent] = {}
    t = 0.0
    for _ in range(draw(st.integers(5, 30))):
        t += draw(st.sampled_from([5.0, 15.0, 15.0, 15.0, 70.0, 400.0]))
        node = draw(st.sampled_from(NODES))
        cluster = CLUSTER[node]
        kind = draw(st.sampled_from(KINDS))
        if kind in ("repeat", "copy") and node in last:
            prev = last[node]
            data = prev.data if kind == "repeat" else msgspec.json.decode(msgspec.json.encode(prev.data),
                                                                             type=type(prev.data))
            out.append((t, prev.model_copy(update={"time": at(t), "data": data})))
        elif kind in ("snap", "repeat", "copy"):
            n = draw(st.integers(0, 3))
            ev = snapshot(at(t), node, gpus=[draw(_gpu(i)) for i in range(n)], processes=_procs(draw, draw(
                st.integers(0, n))), labels={"pool": draw(st.sampled_from(["a", "a", "b"]))}, cluster=cluster)
            ev = with_data(ev, jobs=_jobs(draw))
            last[node] = ev
            out.append((t, ev))
        elif kind in ("gpu", "xid"):
            g = draw(_gpu(draw(st.integers(0, 2)))).model_copy(update={"node": node})
            if draw(st.booleans()):  # as the agent's threshold events carry it when a scheduler allocated the GPU
                job = draw(st.sampled_from(JOB_IDS))
                g = g.model_copy(update={"allocated": job is not None, "job": job})
            if kind == "xid":
                out.append((t, make_event("gpu.xid", node, GpuXid(**{**g.model_dump(), "xid": 79}), time=at(t),
                                          cluster=cluster)))
            else:
                ev_type = draw(st.sampled_from(["gpu.hot", "gpu.idle", "gpu.active", "gpu.lost"]))
                out.append((t, make_event(ev_type, node, g, time=at(t), cluster=cluster)))
        elif kind == "sweep":  # a slice of a tick's sweep, as the engine sends them
            rule = draw(st.sampled_from(["idle-long", "old", "job-idle-long", "xid-recent", "wanted", "spread-idle"]))
            keys = tuple(draw(st.lists(st.sampled_from([f"{KEYS[n]}/gpu{i}" for n in NODES for i in range(3)]
                                                       + JOB_KEYS), max_size=4)))
            out.append((t, Sweep(rule=rule, keys=keys)))
        elif kind == "proc":
            p = _procs(draw, 3)[draw(st.integers(0, 2))].model_copy(update={"node": node})
            out.append((t, make_event(draw(st.sampled_from(["process.started", "process.ended"])), node, p,
                                      time=at(t), cluster=cluster)))
        elif kind in ("stop", "start"):
            ev_type = "agent.stopping" if kind == "stop" else "agent.started"
            interval = draw(st.sampled_from([15.0, 15.0, 60.0, None]))
            out.append((t, make_event(ev_type, node, AgentInfo(node=node, version="1", snapshot_interval_s=interval),
                                      time=at(t), cluster=cluster)))
        elif kind == "forget":
            out.append((t, ForgetNode(node=node, cluster=cluster)))
            last.pop(node, None)
        elif kind == "snooze":
            out.append((t, _snooze(draw, node, t)))
        elif kind == "demand":
            entries = [DemandEntry(pool=draw(st.sampled_from(["a", "b"])), pending_gpus=draw(st.integers(0, 4)),
                                   waiting_since=at(t - draw(st.sampled_from([0.0, 500.0]))))]
            report = DemandReport(scheduler=draw(st.sampled_from(["slurm", "kubernetes"])), entries=entries,
                                  valid_for_s=draw(st.sampled_from([None, 60.0])))
            out.append((t, DemandEvent(source=f"node/{SCHEDULER_SOURCE}", cluster=cluster, time=at(t), data=report)))
        elif kind == "ended":
            jid = draw(st.sampled_from(["7", KUBE]))
            ended = JobEnded(id=jid, scheduler="slurm" if jid == "7" else "kubernetes", user="erin",
                             nodes=draw(st.sampled_from([[node], ["n1", "n2"], []])), ended_at=at(t), gpu_hours=2.0,
                             started_at=T0, gpu_count=2)
            out.append((t, JobEndedEvent(source=f"node/{SCHEDULER_SOURCE}", cluster=cluster, time=at(t),
                                         data=ended)))
        elif kind == "outcome":
            out.append((t, Outcome(draw(st.integers(0, 5)), draw(st.sampled_from(["ok", "failed", "expired"])))))
        elif kind == "reload":
            out.append((t, Reload(draw(st.integers(0, 2)))))
        else:
            out.append((t, Tick(sweep=draw(st.booleans()))))
    return out
