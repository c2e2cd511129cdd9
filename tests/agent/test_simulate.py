"""The simulated sampler and fleet: determinism for a seed, the shipped scenarios, simulated kills."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.runner import NodeAgent, simulated_agents
from agent.scenario import Scenario, load_scenario, shipped_scenarios
from agent.simulate import SimulatedNode, fleet
from gpuevents.commands import KillCommand
from gpuevents.config import Config, ProtectConfig
from gpuevents.yamlpos import LocatedError

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def run_fleet(seed: int, seconds: int = 120, step: float = 5) -> list[object]:
    nodes = fleet(load_scenario("idle-heavy"), nodes=3, gpus_per_node=4, seed=seed, start=T0)
    out: list[object] = []
    t = 0.0
    while t <= seconds:
        now = T0 + timedelta(seconds=t)
        for n in nodes:
            r = n.sample(now)
            out.append(r)
            out.append(sorted(n.identify([p.pid for p in r.procs]).items()))
        t += step
    return out


def test_same_seed_same_fleet() -> None:
    assert run_fleet(7) == run_fleet(7)


def test_another_seed_another_fleet() -> None:
    assert run_fleet(7) != run_fleet(8)


def test_nodes_differ_within_a_fleet() -> None:
    a, b = fleet(load_scenario("mixed"), nodes=2, gpus_per_node=8, seed=1, start=T0)
    assert a.node == "sim-000" and b.node == "sim-001"
    ra, rb = a.sample(T0), b.sample(T0)
    assert [g.uuid for g in ra.gpus] != [g.uuid for g in rb.gpus]
    assert ra != rb


def test_every_shipped_scenario_loads_and_samples() -> None:
    assert {"demo", "mixed", "steady", "idle-heavy"} <= set(shipped_scenarios())
    for name in shipped_scenarios():
        node = SimulatedNode(load_scenario(name), node="n1", gpus=8, seed=1, start=T0)
        r = node.sample(T0)
        assert len(r.gpus) == 8 + len(node.instances)
        assert [g.index for g in r.gpus] == list(range(len(r.gpus)))
        ids = node.identify([p.pid for p in r.procs])
        assert set(ids) == {p.pid for p in r.procs}
        assert all(i.create_time <= T0 and i.user for i in ids.values())


def test_steady_scenario_is_eight_gpus_and_sixteen_processes() -> None:
    node = SimulatedNode(load_scenario("steady"), node="n1", gpus=8, seed=1, start=T0)
    for s in range(0, 120, 10):
        r = node.sample(T0 + timedelta(seconds=s))
        assert len({p.pid for p in r.procs}) == 16
        assert all(g.util_pct is not None and g.util_pct >= 80 for g in r.gpus)


def test_demo_scenario_has_an_idle_held_gpu_at_once() -> None:
    (agent,) = simulated_agents(Config(), nodes=1, gpus_per_node=4, scenario="demo", start=T0)
    events = agent.tick(T0)
    idle = [e for e in events if e.type == "gpu.idle" and e.data.index == 0]
    assert idle and idle[0].data.pids and idle[0].data.owner == "alice"
    snap = agent.core.snapshot(T0)
    assert snap.gpus[0].mem_used_mib and snap.gpus[0].mem_used_mib > 20000
    assert not snap.gpus[1].idle
    alice = next(p for p in snap.processes if p.user == "alice")
    assert alice.age_s == 3 * 3600
    # the ghost on GPU 2 turns up after 20 seconds
    assert not agent.core.processes_on(2)
    for s in range(1, 22):
        agent.tick(T0 + timedelta(seconds=s))
    assert [h.ident.user for h in agent.core.processes_on(2)] == ["carol"]


def test_idle_holder_blip_does_not_end_idle() -> None:
    scenario = Scenario.model_validate({**load_scenario("mixed").model_dump(), "pinned": [
        {"gpu": 0, "kind": "idle_holder", "util_pct": 0, "mem_pct": 20}]})
    (agent,) = simulated_agents(Config(), nodes=1, gpus_per_node=1, scenario=scenario, start=T0)
    utils = []
    for s in range(0, 3 * 1200 + 1, 10):
        agent.tick(T0 + timedelta(seconds=s))
        utils.append(agent.core.readings[0].util_pct)
    assert sum(1 for u in utils if u and u >= 60) == 3  # one blip every 20 minutes
    assert agent.core.gpu_states[0].idle and agent.core.gpu_states[0].idle_since == T0


def test_speedup_shortens_jobs() -> None:
    slow = SimulatedNode(load_scenario("mixed"), node="n", gpus=8, seed=3, start=T0)
    fast = SimulatedNode(load_scenario("mixed"), node="n", gpus=8, seed=3, start=T0, speedup=100)
    seen_slow: set[int] = set()
    seen_fast: set[int] = set()
    for s in range(0, 600, 10):
        seen_slow |= {p.pid for p in slow.sample(T0 + timedelta(seconds=s)).procs}
        seen_fast |= {p.pid for p in fast.sample(T0 + timedelta(seconds=s)).procs}
    assert len(seen_fast) > 2 * len(seen_slow)


async def test_simulated_kill_ends_the_process_and_a_ghost_needs_kill() -> None:
    (agent,) = simulated_agents(Config(protect=ProtectConfig(users=[])), nodes=1, gpus_per_node=4,
                                scenario="demo", start=T0)
    for s in range(0, 25):
        agent.tick(T0 + timedelta(seconds=s))
    alice = agent.core.processes_on(0)[0].ident
    reply = await agent.kill.handle(KillCommand(pid=alice.pid, create_time=alice.create_time, grace_s=1))
    assert reply.outcome == "exited"
    ghost = agent.core.processes_on(2)[0].ident
    reply = await agent.kill.handle(KillCommand(pid=ghost.pid, create_time=ghost.create_time, grace_s=0.1))
    assert reply.outcome == "killed" and reply.signal == "KILL"
    events = agent.tick(T0 + timedelta(seconds=26))
    ended = sorted(e.data.pid for e in events if e.type == "process.ended")
    assert ended == sorted([alice.pid, ghost.pid])
    assert not agent.core.processes_on(0)


def test_bad_scenario_says_where(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("name: bad\njobs:\n  - kind: training\n    duration: [4h, 1h]\n")
    with pytest.raises(LocatedError, match=r"bad.yaml:4"):
        load_scenario(f)
    with pytest.raises(LocatedError, match="shipped: a100-mig, demo"):
        load_scenario("no-such-scenario")


def test_node_agent_uses_the_simulation_as_process_control() -> None:
    node = SimulatedNode(load_scenario("steady"), node="n1", gpus=1, seed=1, start=T0)
    agent = NodeAgent(Config(), node)
    assert agent.kill.control is node


def test_an_idle_gpu_clocks_down_and_draws_less_while_energy_keeps_counting() -> None:
    node = SimulatedNode(load_scenario("hopper-mig"), node="n1", gpus=8, seed=1, start=T0)
    first = {g.index: g for g in node.sample(T0).gpus}
    later = {g.index: g for g in node.sample(T0 + timedelta(seconds=10)).gpus}
    plain = [g for g in later.values() if g.index < 8 and g.util_pct is not None]
    idle = [g for g in plain if g.util_pct == 0]
    busy = [g for g in plain if (g.util_pct or 0) > 50]
    assert idle and busy
    assert max(g.sm_clock_mhz or 0 for g in idle) < min(g.sm_clock_mhz or 0 for g in busy)
    assert max(g.power_w or 0 for g in idle) < min(g.power_w or 0 for g in busy)
    for i in range(8):  # mJ: about the power over the 10 s between the samples
        gained = (later[i].energy_mj or 0) - (first[i].energy_mj or 0)
        assert abs(gained - (later[i].power_w or 0) * 10_000) <= 0.5 * (later[i].power_w or 0) * 10_000


def test_hopper_has_gpm_activity_and_an_ampere_has_none() -> None:
    hopper = SimulatedNode(load_scenario("hopper-mig"), node="n1", gpus=8, seed=1, start=T0).sample(T0)
    assert all(g.sm_active_pct is not None and g.tensor_active_pct is not None for g in hopper.gpus)
    spinner = [g for g in hopper.gpus if (g.util_pct or 0) > 90 and (g.sm_active_pct or 0) < 5]
    assert spinner  # near-100% utilization, SMs idle: the job kind only GPM tells apart
    ampere = Scenario.model_validate({**load_scenario("mixed").model_dump(),
                                      "gpu": {"name": "NVIDIA A100-SXM4-80GB"}})
    r = SimulatedNode(ampere, node="n1", gpus=8, seed=1, start=T0).sample(T0)
    assert all(g.sm_active_pct is None and g.gr_engine_active_pct is None for g in r.gpus)


def test_mig_instances_are_numbered_after_the_gpus_and_sum_to_their_gpu() -> None:
    node = SimulatedNode(load_scenario("hopper-mig"), node="n1", gpus=8, seed=1, start=T0)
    r = node.sample(T0)
    parent = r.gpus[6]
    mine = [g for g in r.gpus if g.mig_parent == parent.uuid]
    assert [(g.index, g.mig_gi_id, g.mig_profile) for g in mine] == [
        (8, 1, "3g.40gb"), (9, 2, "2g.20gb"), (10, 3, "1g.10gb"), (11, 4, "1g.10gb")]
    assert parent.util_pct is None and all(g.util_pct is not None for g in mine)  # NVML has none for it
    assert parent.mem_used_mib == round(sum(g.mem_used_mib or 0 for g in mine), 1)
    weights = {"3g.40gb": 3, "2g.20gb": 2, "1g.10gb": 1}
    expected = sum((g.sm_active_pct or 0) * weights[g.mig_profile or ""] / 7 for g in mine)
    assert abs((parent.sm_active_pct or 0) - expected) < 0.2
    assert all(g.power_w is None and g.temp_c is None for g in mine)
    procs_on = {p.gpu for p in r.procs}
    assert 6 not in procs_on and 7 not in procs_on  # processes run in the instances


def test_pods_have_containers_and_slurm_jobs_come_from_the_scenario() -> None:
    node = SimulatedNode(load_scenario("hopper-mig"), node="n1", gpus=8, seed=1, start=T0)
    r = node.sample(T0)
    ids = node.identify([p.pid for p in r.procs])
    assert ids and all(i.pod and i.container and i.job for i in ids.values())
    plain = SimulatedNode(load_scenario("steady"), node="n1", gpus=8, seed=1, start=T0)
    ids = plain.identify([p.pid for p in plain.sample(T0).procs])
    assert all(i.container is None and i.job is None for i in ids.values())


def test_a_bad_mig_layout_says_what_is_wrong(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: x\npinned: [{gpu: 0, kind: idle_holder}]\ngpu:\n  mig:\n    gpus: [0]\n"
                 "    profiles: [4g.40gb, 4g.40gb]\n")
    with pytest.raises(LocatedError) as e:
        load_scenario(f)
    assert "need more than the 7 compute slices" in str(e.value.problems[0])
