"""The usage and fits aggregators keep a node's plan across readings that change no key; fed the same random snapshots
(owners, pids, idle, power, models and jobs changing, nodes falling silent, redelivered and out-of-order snapshots,
repeated snapshot objects, flushes and forgotten nodes in between) they drain what the old ones did
(tests/rules/usage/reference_rollup.py, reference_fits.py), bucket for bucket, to the last bit."""

from __future__ import annotations

import os
from dataclasses import astuple
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent, make_event
from rules.usage.fits import FitAggregator
from rules.usage.rollup import TeamResolver, UsageAggregator
from tests.quick import examples
from tests.rules.usage import reference_fits
from tests.rules.usage import reference_rollup as ref

EXAMPLES = int(os.environ.get("GPUEVENTS_PROPERTY_EXAMPLES", "150"))
T0 = datetime(2026, 3, 2, 9, 58, tzinfo=UTC)  # two minutes before an hour: intervals cross it
TEAMS = TeamResolver(team_label="team", owners={"u1": "alice"}, teams={"alice": "ml", "bob": "infra"})
RATED = {"A100": 400.0, "H100": 700.0}


def _rated(model: str | None) -> float:
    return RATED.get(model or "", 0.0)


maybe_f = st.one_of(st.none(), st.floats(0, 100, allow_nan=False))
gpu_s = st.fixed_dictionaries({
    "idle": st.booleans(), "activity_known": st.booleans(), "model": st.sampled_from([None, "A100", "H100"]),
    "pids": st.lists(st.sampled_from([1, 2, 3]), max_size=2, unique=True),
    "owners": st.lists(st.sampled_from(["alice", "bob"]), max_size=2, unique=True),
    "owner": st.sampled_from([None, "carol"]), "allocated": st.sampled_from([None, True, False]),
    "job": st.sampled_from([None, "7"]), "util_pct": maybe_f, "power_w": st.one_of(st.none(), st.floats(-5, 700)),
    "power_cap_saved_w": maybe_f, "lost": st.booleans(),
})
proc_s = st.fixed_dictionaries({
    "user": st.sampled_from([None, "u1", "bob"]), "owner": st.sampled_from([None, "dave"]),
    "job": st.sampled_from([None, "7"]), "pod": st.sampled_from([None, "ns/p"]),
    "gpu_util_pct": maybe_f, "team": st.sampled_from([None, "vision"]),
})
step_s = st.one_of(
    st.tuples(st.just("snap"), st.sampled_from(["n1", "n2"]), st.integers(-30, 200),
              st.lists(gpu_s, min_size=1, max_size=3), st.lists(proc_s, max_size=3), st.booleans(), st.booleans()),
    st.tuples(st.just("again"), st.sampled_from(["n1", "n2"]), st.integers(-30, 200)),
    st.tuples(st.just("readings"), st.sampled_from(["n1", "n2"]), st.integers(1, 200), maybe_f, maybe_f),
    st.tuples(st.just("flush"), st.integers(0, 300)),
    st.tuples(st.just("forget"), st.sampled_from(["n1", "n2"])),
)


def _snapshot(node: str, gpus: list[dict[str, Any]], procs: list[dict[str, Any]], job: bool, team: bool,
              at: datetime) -> NodeSnapshot:
    processes = [ProcessInfo(node=node, pid=i + 1, name=f"p{i}", user=p["user"], owner=p["owner"], job=p["job"],
                             pod=p["pod"], gpu_util_pct=p["gpu_util_pct"], create_time=T0,
                             labels={"team": p["team"]} if p["team"] else {}) for i, p in enumerate(procs)]
    return NodeSnapshot(
        node=NodeInfo(name=node, labels={"team": "lab"} if team else {}),
        gpus=[GpuInfo(node=node, index=i, uuid=f"{node}-{i}", **g) for i, g in enumerate(gpus)],
        processes=processes,
        jobs=[JobInfo(id="7", user="u1", name="train", gpus=[0])] if job else [],
        time=at,
    )


def _batch(batch: Any) -> tuple[dict[Any, tuple[Any, ...]], dict[Any, tuple[Any, ...]]]:
    return ({tuple(k): astuple(a) for k, a in batch.usage}, {tuple(k): astuple(a) for k, a in batch.idle_jobs})


@settings(max_examples=examples(EXAMPLES), deadline=None, derandomize=not os.environ.get("GPUEVENTS_PROPERTY_EXAMPLES"),
          suppress_health_check=[HealthCheck.too_slow],
          phases=[p for p in Phase if p != Phase.shrink or not os.environ.get("GPUEVENTS_NO_SHRINK")])
@given(steps=st.lists(step_s, max_size=40))
def test_the_aggregator_drains_what_the_old_one_did(steps: list[tuple[Any, ...]]) -> None:
    new = UsageAggregator(snapshot_interval=15, teams=TEAMS, rated_power_w=_rated)
    old = ref.UsageAggregator(snapshot_interval=15, teams=ref.TeamResolver(
        team_label="team", owners=TEAMS.owners, teams=TEAMS.teams), rated_power_w=_rated)
    fits_new = FitAggregator(snapshot_interval=15, teams=TEAMS)
    fits_old = reference_fits.FitAggregator(snapshot_interval=15, teams=TEAMS)
    clock = T0
    fits_drained = []
    last: dict[str, SnapshotEvent] = {}
    drained = []
    for step in steps:
        event: SnapshotEvent | None = None
        if step[0] == "snap":
            _, node, dt, gpus, procs, job, team = step
            at = clock + timedelta(seconds=dt)
            event = make_event("node.snapshot", node, _snapshot(node, gpus, procs, job, team, at), time=at)
        elif step[0] == "again" and step[1] in last:  # the engine's repeated snapshot: the very object
            at = clock + timedelta(seconds=step[2])
            event = make_event("node.snapshot", step[1], last[step[1]].data, time=at)
        elif step[0] == "readings" and step[1] in last:  # same keys, new readings
            prev = last[step[1]].data
            at = clock + timedelta(seconds=step[2])
            snap = replace(prev, gpus=[replace(g, util_pct=step[3], power_w=step[4]) for g in prev.gpus])
            event = make_event("node.snapshot", step[1], snap, time=at)
        elif step[0] == "flush":
            clock += timedelta(seconds=step[1])
            new.settle(clock)
            old.settle(clock)
            drained.append((_batch(new.drain()), _batch(old.drain())))
            fits_drained.append((fits_new.drain(), fits_old.drain()))
        elif step[0] == "forget":
            new.forget("default", step[1])
            old.forget("default", step[1])
            fits_new.forget("default", step[1])
            fits_old.forget("default", step[1])
        if event is not None:
            new.observe(event, clock + timedelta(seconds=60))
            old.observe(event, clock + timedelta(seconds=60))
            fits_new.observe(event, clock + timedelta(seconds=60))
            fits_old.observe(event, clock + timedelta(seconds=60))
            last[event.node] = event
            clock = max(clock, event.time)
    clock += timedelta(seconds=100)
    new.settle(clock)
    old.settle(clock)
    drained.append((_batch(new.drain()), _batch(old.drain())))
    fits_drained.append((fits_new.drain(), fits_old.drain()))
    for fits_got, fits_want in fits_drained:
        assert [(tuple(k), astuple(a)) for k, a in fits_got] == [(tuple(k), astuple(a)) for k, a in fits_want]
    for got, want in drained:  # the same sums in the same order: equal to the last bit
        assert got == want
