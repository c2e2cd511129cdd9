"""The power_cap command through the NVML stand-in: a held-idle GPU's limit lowered within its bounds, checked
as a kill is, and put back on activity, when a holder ends, on restore, when the agent stops or starts again."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from agent.nvml import NvmlSampler
from agent.runner import NodeAgent
from agent.sample import ProcessIdentity
from agent.scenario import load_scenario
from agent.simulate import SimulatedNode
from gpuevents.bus.serving import Message
from gpuevents.commands import KillTarget, PowerCapCommand, PowerCapReply
from gpuevents.config import Config
from gpuevents.events import SnapshotEvent
from tests.agent.fake_pynvml import FakeDevice, FakeNvml

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
BORN = NOW - timedelta(hours=3)


class NoPsutil:
    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        return {p: ProcessIdentity(pid=p, create_time=BORN, name="jupyter", user="alice" if p < 200 else "root")
                for p in pids}


def devices() -> list[FakeDevice]:
    return [FakeDevice(uuid="GPU-0", util=0, compute=[(100, 20000)], power_mw=150_000),
            FakeDevice(uuid="GPU-1", util=95, compute=[(101, 70000)], power_mw=650_000)]


def agent(tmp: Path | None, devs: list[FakeDevice], **power: object) -> NodeAgent:
    nv = FakeNvml(devs)
    cfg = Config.model_validate({"agent": {"node_name": "n1", "state_dir": str(tmp) if tmp else None,
                                           "power_cap": power, "kill": {"max_per_minute": 10}},
                                 "protect": {"users": ["root"]}})
    return NodeAgent(cfg, NvmlSampler(nv, identifier=NoPsutil()), node="n1")


def cap(a: NodeAgent, index: int = 0, pids: tuple[int, ...] = (100,), **kw: object) -> PowerCapReply:
    uuid = kw.pop("uuid", f"GPU-{index}")
    return a.power.handle(PowerCapCommand(index=index, uuid=str(uuid), rule="power-cap-idle-30m",
                                          processes=[KillTarget(pid=p, create_time=BORN) for p in pids],
                                          **kw))


def tick(a: NodeAgent, minutes: float) -> SnapshotEvent | None:
    a.core.last_snapshot_at = None
    return next((e for e in a.tick(NOW + timedelta(minutes=minutes)) if isinstance(e, SnapshotEvent)), None)


def test_a_held_idle_gpu_is_capped_to_its_minimum_and_restored_on_activity(tmp_path: Path) -> None:
    devs = devices()
    a = agent(tmp_path, devs)
    tick(a, 0)
    reply = cap(a)
    assert (reply.outcome, reply.limit_w, reply.previous_w) == ("capped", 200.0, 700.0)
    assert devs[0].limit_mw == 200_000
    saved = json.loads((tmp_path / "power-caps-n1.json").read_text())["caps"]
    assert [(c["index"], c["original_w"], c["cap_w"]) for c in saved] == [(0, 700.0, 200.0)]
    devs[0].power_mw = 60_000  # it draws less under the cap
    snap = tick(a, 1)
    assert snap is not None
    g0 = snap.data.gpus[0]
    assert (g0.power_cap_w, g0.power_cap_saved_w) == (200.0, 90.0)  # 150 W before, 60 W now
    assert cap(a).outcome == "unchanged"  # already capped
    devs[0].util = 90
    for m in (2, 3):
        tick(a, m)
        assert devs[0].limit_mw == 200_000  # one busy sample is a blip, not activity
    tick(a, 4)  # the third busy sample: active
    assert devs[0].limit_mw == 700_000 and not a.power.caps
    assert json.loads((tmp_path / "power-caps-n1.json").read_text())["caps"] == []


def test_what_a_kill_would_refuse_a_cap_refuses(tmp_path: Path) -> None:
    devs = [*devices(), FakeDevice(uuid="GPU-2", util=0, compute=[(300, 1000)])]
    a = agent(tmp_path, devs)
    tick(a, 0)
    assert "not idle" in cap(a, 1, (101,)).reason
    assert "not the ones named" in cap(a, 0, (100, 999)).reason
    assert "no process named" in cap(a, 0, ()).reason
    assert "is GPU-0, not GPU-9" in cap(a, 0, uuid="GPU-9").reason
    assert "protected" in cap(a, 2, (300,)).reason  # root's process
    reused = a.power.handle(PowerCapCommand(index=0, uuid="GPU-0", processes=[
        KillTarget(pid=100, create_time=BORN + timedelta(seconds=30))]))
    assert reused.outcome == "refused"  # the pid was reused: another process
    assert all(d.limit_mw == 700_000 for d in devs)
    assert agent(None, devices()).power.handle(PowerCapCommand(index=0)).reason.startswith(
        "power caps need agent.state_dir")


def test_bounds_dry_run_and_the_rate(tmp_path: Path) -> None:
    devs = devices()
    a = agent(tmp_path, devs)
    tick(a, 0)
    assert cap(a, watts=50).reason == "raised to the GPU's minimum 200 W"
    assert a.power.handle(PowerCapCommand(index=0, uuid="GPU-0", restore=True)).outcome == "restored"
    assert devs[0].limit_mw == 700_000
    devs[0].limit_mw = 250_000  # someone set it lower already
    assert cap(a, watts=300).outcome == "unchanged"
    devs[0].limit_mw = 700_000
    dry = agent(tmp_path / "dry", devices(), dry_run=True)
    tick(dry, 0)
    r = cap(dry)
    assert (r.outcome, r.dry_run, r.limit_w) == ("capped", True, 200.0) and not dry.power.caps
    off = agent(tmp_path / "off", devices(), max_per_minute=0)
    tick(off, 0)
    assert "disabled" in cap(off).reason


def test_a_holder_ending_puts_the_limit_back(tmp_path: Path) -> None:
    devs = devices()
    a = agent(tmp_path, devs)
    tick(a, 0)
    assert cap(a).outcome == "capped"
    devs[0].compute = []
    tick(a, 1)
    assert devs[0].limit_mw == 700_000 and not a.power.caps


def test_a_crashed_agent_s_caps_are_put_back_when_it_starts_and_a_stop_puts_them_back(tmp_path: Path) -> None:
    devs = devices()
    first = agent(tmp_path, devs)
    tick(first, 0)
    assert cap(first).outcome == "capped"
    # the agent dies without a word: the next one, on the same GPUs, finds the cap in the state dir
    second = agent(tmp_path, devs)
    assert devs[0].limit_mw == 700_000 and not second.power.caps
    tick(second, 1)
    assert cap(second).outcome == "capped"
    devs[0].limit_mw = 320_000  # an operator set a limit of their own since: left as it is
    third = agent(tmp_path, devs)
    assert devs[0].limit_mw == 320_000 and not third.power.caps
    tick(third, 2)
    devs[0].limit_mw = 700_000
    assert cap(third).outcome == "capped"
    replies = third.power.restore_all("the agent stops")
    assert [r.outcome for r in replies] == ["restored"] and devs[0].limit_mw == 700_000


async def test_the_bus_handler_answers_json_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    a = agent(tmp_path, devices())
    tick(a, 0)
    cmd = PowerCapCommand(index=0, uuid="GPU-0", processes=[KillTarget(pid=100, create_time=BORN)])
    reply = PowerCapReply.model_validate_json(await a.power.answer(Message(cmd.model_dump_json().encode(), "s")))
    assert reply.outcome == "capped"
    bad = PowerCapReply.model_validate_json(await a.power.answer(Message(b'{"index": "x"}', "s")))
    assert bad.outcome == "refused" and "malformed" in bad.reason


def test_the_simulated_sampler_takes_caps_too(tmp_path: Path) -> None:
    sim = SimulatedNode(load_scenario("demo"), node="n1", gpus=2, start=NOW)
    cfg = Config.model_validate({"agent": {"node_name": "n1", "state_dir": str(tmp_path)}})
    a = NodeAgent(cfg, sim, node="n1")
    tick(a, 0)
    held = a.core.processes_on(0)
    assert held and a.core.gpu_states[0].idle  # the demo's GPU 0: alice's notebook, idle from the start
    reply = a.power.handle(PowerCapCommand(index=0, uuid=a.core.readings[0].uuid, processes=[
        KillTarget(pid=h.ident.pid, create_time=h.ident.create_time) for h in held]))
    assert (reply.outcome, reply.limit_w) == ("capped", 210.0)  # 30 % of the H100's 700 W
    snap = tick(a, 1)
    assert snap is not None and snap.data.gpus[0].power_limit_w == 210.0
    assert a.power.restore_all("the agent stops")[0].outcome == "restored" and not sim.power_limits
