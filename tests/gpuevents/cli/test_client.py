"""`gpuevents status`, `snooze`, `audit` and `rules backtest` against a running engine on a real nats-server."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import orjson
import pytest
import yaml
from msgspec.structs import replace
from typer.testing import CliRunner

from gpuevents.bus import Bus
from gpuevents.cli import app
from gpuevents.clock import SystemClock
from gpuevents.config import Config
from rules.engine.service import Engine
from tests.rules.engine.conftest import snapshot
from tests.rules.engine.helpers import running
from tests.waiting import wait_for


async def gpuevents(*args: str) -> tuple[int, str]:
    """Run the command line in a thread (it runs its own event loop), as a user would."""
    result = await asyncio.to_thread(CliRunner().invoke, app, list(args))
    return result.exit_code, result.output


def write_config(config: Config, path: Path) -> Path:
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", include={"cluster", "nats", "engine", "agent"})))
    return path


async def test_status_snooze_audit_and_backtest(engine_config: Config, bus: Bus, tmp_path: Path) -> None:
    cfg_file = write_config(engine_config, tmp_path / "config.yaml")
    clock = SystemClock()
    start = clock.now() - timedelta(hours=2)
    bus.publish_event(snapshot("n1", start, idle_since=start))
    assert await bus.flush(5)
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        await wait_for(lambda: engine.core.open_incidents(), what="an incident")

        code, out = await gpuevents("status", "--json", "-c", str(cfg_file))
        assert code == 0, out
        status = orjson.loads(out)
        assert (status["summary"]["gpus"], status["summary"]["held_idle"]) == (1, 1)
        assert (status["summary"]["incidents_pending"], status["incidents"]) == (1, [])  # it lists firing ones
        assert [(w["name"], w["held_idle"]) for w in status["worst_nodes"]] == [("n1", 1)]

        code, out = await gpuevents("status", "-c", str(cfg_file))
        assert code == 0 and "1 held idle" in out and "1 pending" in out and "n1" in out

        code, out = await gpuevents("status", "--node", "n1", "--json", "-c", str(cfg_file))
        assert code == 0, out
        node = orjson.loads(out)
        assert [n["name"] for n in node["nodes"]] == ["n1"] and len(node["nodes"][0]["gpus"]) == 1
        assert [(i["rule"], i["entity_id"]) for i in node["incidents"]] == [("idle-gpu-1h", "n1/gpu0")]
        code, out = await gpuevents("status", "--node", "n1", "-c", str(cfg_file))
        assert code == 0 and "idle-gpu-1h" in out and "n1/gpu0" in out
        code, out = await gpuevents("status", "--node", "nowhere", "-c", str(cfg_file))
        assert code == 1 and "no node named 'nowhere'" in out

        code, out = await gpuevents("status", "--all", "--json", "-c", str(cfg_file))
        assert code == 0, out
        lines = [orjson.loads(line) for line in out.splitlines()]
        assert [next(iter(x)) for x in lines] == ["node", "incident"]
        assert lines[0]["node"]["name"] == "n1" and lines[1]["incident"]["entity_id"] == "n1/gpu0"
        code, out = await gpuevents("status", "--all", "--node", "n1", "-c", str(cfg_file))
        assert code == 2 and "do not go together" in out

        code, out = await gpuevents("snooze", "idle-gpu-1h", "n1/gpu0", "--for", "4h", "-c", str(cfg_file))
        assert code == 0, out
        assert ("idle-gpu-1h", "n1/gpu0") in engine.core.snoozes
        assert not engine.core.open_incidents()  # snoozed: the incident ended

        code, out = await gpuevents("snooze", "no-such-rule", "n1/gpu0", "--for", "4h", "-c", str(cfg_file))
        assert code == 1 and "no rule named" in out

        # `keep` (the owner's button, from a terminal) needs a reason, and is bounded by the rule's snooze_max
        code, out = await gpuevents("keep", "idle-gpu-1h", "n1/gpu0", "3d", "-c", str(cfg_file))
        assert code == 2 and "--reason" in out
        code, out = await gpuevents("keep", "idle-gpu-1h", "n1/gpu0", "3d", "--reason", "  ", "-c", str(cfg_file))
        assert code == 2 and "a keep needs a reason" in out
        code, out = await gpuevents("keep", "idle-gpu-1h", "n1/gpu0", "3d", "--reason", "eval of the 70B run",
                                    "-c", str(cfg_file))
        assert code == 0, out
        kept = engine.core.snoozes[("idle-gpu-1h", "n1/gpu0")]
        assert (kept.until - clock.now()).total_seconds() <= 24 * 3600
        assert (kept.until - clock.now()).total_seconds() > 23 * 3600
        assert (kept.reason, kept.bounded) == ("eval of the 70B run", True)
        assert f"until {kept.until:%Y-%m-%d %H:%M:%S} UTC" in out
        assert "kept for n1/gpu0" in out
        assert ("this rule allows at most 1d and names no approving channel: kept for 1d; for 3d ask whoever "
                "runs gpuevents") in " ".join(out.split())
        code, out = await gpuevents("keep", "idle-gpu-1h", "n1/gpu0", "2h", "--reason", "r", "-c", str(cfg_file))
        assert code == 0 and "at most" not in out

    code, out = await gpuevents("audit", "--rule", "idle-gpu-1h", "--since", "1h", "--json", "-c", str(cfg_file))
    assert code == 0, out
    kinds = [orjson.loads(line)["kind"] for line in out.splitlines() if line.startswith("{")]
    assert "transition" in kinds and "snooze" in kinds

    code, out = await gpuevents("rules", "backtest", str(tmp_path / "rules"), "--since", "3h", "--json",
                                "-c", str(cfg_file))
    assert code == 0, out
    report = orjson.loads(out)
    assert report["events"] == 1
    assert report["rules"][0]["rule"] == "idle-gpu-1h"
    assert report["rules"][0]["fired"] == 1  # idle and held since 2h ago: it would have fired at +1h
    fired_at = report["incidents"][0]["fired_at"]
    assert report["incidents"][0]["entity_id"] == "n1/gpu0"
    assert abs((datetime.fromisoformat(fired_at) - (start + timedelta(hours=1))).total_seconds()) <= 30


async def test_a_backtest_of_a_window_without_events_says_so_instead_of_zeros(
        engine_config: Config, bus: Bus, tmp_path: Path) -> None:
    await bus.ensure_streams()
    rules = tmp_path / "backtest-rules"
    rules.mkdir()
    (rules / "idle.yaml").write_text(
        "rules:\n  - name: idle-gpu-1h\n    entity: gpu\n    when: gpu.idle\n    for: 1h\n"
        "    actions: [{type: log, message: idle}]\n")
    code, out = await gpuevents("rules", "backtest", str(rules), "--since", "14d",
                                "-c", str(write_config(engine_config, tmp_path / "c.yaml")))
    assert code == 0, out
    assert "replayed 0 events" in out
    assert "note: the window holds no events, so no rule could fire" in " ".join(out.split())
    assert "simulate --history" in out


async def test_two_agents_claiming_one_node_show_in_status_log_and_metric(
        engine_config: Config, bus: Bus, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = SystemClock()
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        for i in range(6):  # `up`'s agent and an `agent --simulate` both called n1, taking turns
            ev = snapshot("n1", clock.now())
            node = replace(ev.data.node, agent_id=("up-aaaa1111", "sim-bbbb2222")[i % 2])
            bus.publish_event(ev.model_copy(update={"data": replace(ev.data, node=node)}))
        assert await bus.flush(5)
        metric = "gpuevents_node_claim_conflicts_total"
        await wait_for(lambda: engine.metrics.registry.get_sample_value(metric, {"node": "n1"}) == 1,
                       what="the conflict counted")
        code, out = await gpuevents("status", "-c", str(write_config(engine_config, tmp_path / "c.yaml")))
        assert code == 0, out
        assert "warning: node n1 (cluster c1) is claimed by 2 agents: aaaa1111" in " ".join(out.split())
    assert any("is claimed by 2 agents" in r.getMessage() for r in caplog.records)


async def test_a_simulated_agent_does_not_take_a_node_name_an_engine_sees(engine_config: Config, bus: Bus) -> None:
    import socket

    import typer

    from gpuevents.cli.agent import _simulated_name, names_in_use

    host = socket.gethostname()
    clock = SystemClock()
    async with running(await Engine.open(engine_config, bus, clock=clock)) as engine:
        bus.publish_event(snapshot(f"{host}-sim", clock.now()))
        assert await bus.flush(5)
        await wait_for(lambda: any(n.name == f"{host}-sim" for n in engine.core.nodes()),
                       what="the node seen")
        assert f"{host}-sim" in await names_in_use(engine_config)
        renamed = await asyncio.to_thread(_simulated_name, engine_config)
        assert renamed.agent.node_name == f"{host}-sim-2"
        taken = engine_config.model_copy(update={"agent": engine_config.agent.model_copy(
            update={"node_name": f"{host}-sim"})})
        with pytest.raises(typer.Exit):
            await asyncio.to_thread(_simulated_name, taken)


async def test_a_keep_or_snooze_without_an_engine_stores_nothing_and_says_so(
        engine_config: Config, bus: Bus, tmp_path: Path) -> None:
    """One behaviour for every asker (Slack's Keep says the same): only the engine applies snooze_max and
    approvals, so with none answering nothing is written behind its back."""
    await bus.ensure_streams()
    cfg = str(write_config(engine_config, tmp_path / "c.yaml"))
    code, out = await gpuevents("keep", "idle-gpu-1h", "n1/gpu0", "30d", "--reason", "long run", "-c", cfg)
    assert code == 1
    assert "no engine answered" in out and "n1/gpu0 was not kept" in out and "Nothing was stored" in out
    code, out = await gpuevents("snooze", "idle-gpu-1h", "n1/gpu0", "--for", "4h", "-c", cfg)
    assert code == 1 and "n1/gpu0 was not snoozed" in out
    kv = await bus.kv()
    assert await kv.keys("snooze.") == []


async def test_status_without_an_engine_says_so(engine_config: Config, bus: Bus, tmp_path: Path) -> None:
    code, out = await gpuevents("status", "-c", str(write_config(engine_config, tmp_path / "c.yaml")))
    assert code == 1
    assert "no engine answers" in out


def test_machine_strings_in_the_audit_table_are_shown_as_written_never_as_markup() -> None:
    from io import StringIO

    from rich.console import Console

    from gpuevents.cli.client import audit_table
    from gpuevents.records import AuditRecord

    now = SystemClock().now()
    records = [AuditRecord(time=now, kind="action", rule="r", entity_id="n1/pid7", action_type="kill",
                           outcome="ok", detail="[bold red]EVIL[/]"),
               AuditRecord(time=now, kind="action", rule="r", entity_id="n1/pid8", action_type="kill",
                           outcome="ok", detail="process x[/oops] ended")]
    buf = StringIO()
    Console(file=buf, width=200, color_system=None).print(audit_table(records))
    text = buf.getvalue()
    assert "[bold red]EVIL[/]" in text and "x[/oops]" in text


def test_the_audit_table_wraps_at_80_columns_instead_of_cutting_and_shows_the_facts() -> None:
    """A pipe is 80 columns: every word of a long detail and a long entity id is still there (before, the
    detail was cut at 120 characters and cells ellipsized), and --facts shows what the decision used."""
    from io import StringIO

    from rich.console import Console

    from gpuevents.cli.client import audit_table, facts_text
    from gpuevents.records import AuditRecord

    words = [f"w{i:03d}" for i in range(60)]
    record = AuditRecord(time=SystemClock().now(), kind="action", rule="idle-gpu-8h-stop", action_type="pause",
                         entity_id="job/kubernetes/ml-research/Deployment/trainer-with-a-long-name", outcome="refused",
                         error=" ".join(words), facts={"gpu": {"util_pct": 0, "idle_for_s": 28800},
                                                       "job": {"id": "ml-research/Deployment/trainer"}})
    buf = StringIO()
    Console(file=buf, width=80, color_system=None).print(audit_table([record], facts=True))
    text = buf.getvalue()
    assert all(w in text for w in words) and "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "facts" in text
    assert facts_text(record.facts) == ('gpu.util_pct=0.0\ngpu.idle_for_s=28800.0\n'
                                        'job.id="ml-research/Deployment/trainer"')
