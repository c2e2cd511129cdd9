"""Idle by the clock: a regular idle window is found in the hourly rollups, proposed as a rule that `rules check`
accepts and that scales the service down at the window's start and back at its end; irregular use gets none."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from typer.testing import CliRunner

from gpuevents.bus import StoredMsg
from gpuevents.cli import app
from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from gpuevents.events import encode_event
from rules.core.core import Core
from rules.intake.check import check_paths
from rules.offline.backtest import StreamSummary, stream_backtest, summarize
from rules.usage.fits import FitAmounts, FitKey
from rules.usage.schedules import propose
from rules.usage.store import UsageRow
from tests.rules.engine.conftest import snapshot
from tests.rules.helpers import rules_from

START = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday
COSTS = CostModel(CostsConfig())


def _node_rows(days: int, busy_hours: range, weekends_idle: bool, node: str = "stg-1") -> list[UsageRow]:
    rows = []
    for h in range(days * 24):
        t = START + timedelta(hours=h)
        busy = t.hour in busy_hours and not (weekends_idle and t.weekday() >= 5)
        for gpu in range(2):
            rows.append(UsageRow(int(t.timestamp()), "c", node, gpu, "alice" if busy else "", "ml", "H100",
                                 3600 if busy else 0, 0, 0 if busy else 3600, 0, 0, 0, 0, 0))
    return rows


def _service_fits(days: int, cluster: str = "c") -> list[tuple[FitKey, FitAmounts]]:
    out = []
    for h in range(days * 24):
        t = START + timedelta(hours=h)
        busy = 9 <= t.hour < 18
        hist = [0.0] * 20
        hist[8 if busy else 0] = 3600
        out.append((FitKey(int(t.timestamp()), cluster, "job/kubernetes/chat/Deployment/chat-api"),
                    FitAmounts(owner="carol", team="chat", model="H100", node="gpu-7", gpus=1, held_s=3600,
                               peak_mem_mib=30_000, mem_total_mib=81_559, util_hist=hist)))
    return out


def test_a_node_idle_every_night_and_weekend_gets_a_cordon_rule_for_those_hours(tmp_path: Path) -> None:
    (p,) = propose(_node_rows(14, range(8, 20), weekends_idle=True), [], COSTS, "UTC")
    assert (p.key, p.idle.start_hour, p.idle.hours, p.idle.weekends) == ("node/stg-1", 20, 12, True)
    assert p.idle.regularity == 1.0 and p.gpus == 2
    assert p.saving_per_week == COSTS.hourly("H100") * 2 * (12 * 5 + 48)
    assert "in_window('Mon-Fri 20:00-24:00, Mon-Fri 00:00-08:00, Sat-Sun 00:00-24:00')" in p.rule_yaml
    (tmp_path / "proposed.yaml").write_text(p.rule_yaml)
    rules, problems = check_paths([tmp_path / "proposed.yaml"])
    assert not problems and rules is not None and len(rules.rules) == 1


def test_a_slurm_node_is_drained_through_slurm_and_same_named_nodes_of_two_clusters_are_kept_apart(
        tmp_path: Path) -> None:
    rows = _node_rows(14, range(8, 20), weekends_idle=True)  # cluster c: idle nights and weekends
    other = [UsageRow(r.hour, "d", r.node, r.gpu, "bob", r.team, r.model, 3600, 0, 0, 0, 0, 0, 0, 0)
             for r in rows]  # cluster d's stg-1: busy around the clock
    job = [(FitKey(rows[9 * 2].hour, "c", "job/slurm/77"), FitAmounts(owner="alice", node="stg-1", held_s=3600))]
    (p,) = propose(rows + other, job, COSTS, "UTC")
    assert (p.key, p.cluster, p.idle.hours) == ("node/stg-1", "c", 12)
    assert "when: node.cluster == 'c' and node.name == 'stg-1' and in_window(" in p.rule_yaml
    assert "type: cordon\n        provider: slurm" in p.rule_yaml and "provider: kubernetes" not in p.rule_yaml
    (tmp_path / "proposed.yaml").write_text(p.rule_yaml)
    rules, problems = check_paths([tmp_path / "proposed.yaml"])
    assert not problems and rules is not None
    # without a Slurm job seen on it, a node is cordoned through Kubernetes
    (k,) = propose(rows, [], COSTS, "UTC")
    assert "provider: kubernetes" in k.rule_yaml and "provider: slurm" not in k.rule_yaml


def test_a_service_idle_outside_office_hours_gets_a_scale_down_rule_that_runs_in_a_rule_test(tmp_path: Path) -> None:
    (p,) = propose([], _service_fits(10), COSTS, "UTC")
    assert (p.key, p.idle.start_hour, p.idle.hours, p.idle.weekends) == (
        "job/kubernetes/chat/Deployment/chat-api", 18, 15, False)
    (tmp_path / "proposed.yaml").write_text(p.rule_yaml)
    name = p.rule_yaml.split("name: ")[1].split("\n")[0]
    (tmp_path / "proposed.test.yaml").write_text(f"""rule_files: [proposed.yaml]
start: "2026-01-07T12:00:00"
tick: 5m
tests:
  - name: scaled to zero at 18:00 and restored at 09:00
    snapshots:
      - {{at: 0s, node: gpu-7, cluster: c, gpus: [{{index: 0, util_pct: 40}}]}}
      - {{at: 0s, node: gpu-8, gpus: [{{index: 0, util_pct: 40}}]}}
    expect:
      - rule: {name}
        entity: "c:gpu-7"
        fires_at: 6h
        resolves_at: 21h
        actions: [{{type: scale, namespace: chat, name: chat-api, replicas: 0}}]
        resolve_actions: [{{type: scale, replicas: previous}}]
      - rule: {name}
        entity: gpu-8
        never: true
""")
    result = CliRunner().invoke(app, ["rules", "test", str(tmp_path / "proposed.test.yaml")])
    assert result.exit_code == 0, result.output


def test_irregular_use_and_too_few_days_propose_nothing() -> None:
    rng = random.Random(3)
    noisy = [r for r in _node_rows(14, range(8, 20), weekends_idle=False)]
    noisy = [UsageRow(r.hour, r.cluster, r.node, r.gpu, "bob", r.team, r.model, 3600, 0, 0, 0, 0, 0, 0, 0)
             if rng.random() < 0.4 else r for r in noisy]
    assert propose(noisy, [], COSTS, "UTC") == []
    assert propose(_node_rows(3, range(8, 20), weekends_idle=False), [], COSTS, "UTC") == []
    always_idle = _node_rows(14, range(0), weekends_idle=False)
    assert propose(always_idle, [], COSTS, "UTC") == []  # idle all day: for the idle rules, not a schedule


async def test_a_proposed_rule_replays_in_a_backtest_scaling_down_in_the_window_and_back_after(tmp_path: Path) -> None:
    (p,) = propose([], _service_fits(10, cluster="c1"), COSTS, "UTC")
    rules = rules_from(tmp_path, p.rule_yaml)
    name = rules.rules[0].name
    t0 = datetime(2026, 1, 14, 12, tzinfo=UTC)  # a Wednesday noon; 26 hours of its nodes' snapshots, busy
    end = t0 + timedelta(hours=26)

    async def messages() -> AsyncIterator[StoredMsg]:
        for i in range(26 * 120):  # every 30 s, as agents send them (a silence would be an offline node)
            at = t0 + timedelta(seconds=30 * i)
            for cluster, node in (("c1", "gpu-7"), ("c1", "gpu-8"), ("c2", "gpu-7")):  # c2's gpu-7 is another
                event = snapshot(node, at, util=40).model_copy(update={"cluster": cluster})
                yield StoredMsg(f"gpuevents.evt.{cluster}.{node}.node.snapshot", encode_event(event), i, at)

    summary = StreamSummary(t0)
    events, malformed = await stream_backtest(Core(rules), messages(), t0, end, summary)
    report = summarize(summary.rec, [name], t0, end, events, malformed)
    assert (events, malformed) == (3 * 26 * 120, 0)
    got = [(i.entity_id, i.fired_at, i.resolved_at, i.actions) for i in report.incidents]
    # scaled to zero at the idle window's start (18:00), back at its end (09:00), on the node it is anchored to
    assert got == [("c1:gpu-7", t0.replace(hour=18), t0.replace(hour=9) + timedelta(days=1),
                    ["fire:scale", "resolve:scale"])], got
