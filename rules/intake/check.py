"""`rules check`: load a rule set, then render every template against a sample entity of its kind."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from actions import registry
from gpuevents.config import Config
from gpuevents.events import GpuInfo, JobInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent
from gpuevents.yamlpos import Located, LocatedError
from rules.core.incidents import open_incident, step
from rules.core.limits import Limiter
from rules.core.sends import Sender
from rules.core.state import Entity, FleetState
from rules.intake.channels import channel_problems
from rules.lang.loader import load_rule_set
from rules.lang.model import CompiledAction, Rule, RuleSet
from rules.lang.templates import render_params
from rules.lang.views import EvalClock

SAMPLE_NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


class SampleLabels(dict[str, str]):
    """Labels of the sample entities: any key exists (labels are free-form; a missing one is no typo)."""

    def __missing__(self, key: str) -> str:
        return f"sample-{key}"


def sample_entities(now: datetime = SAMPLE_NOW) -> dict[str, Entity]:
    """One node, GPU and process as rules see them: an idle GPU held by an old process."""
    clock = EvalClock(now)
    state = FleetState(clock, owners={"alice": "alice@example.com"})
    hour = timedelta(hours=1)
    snap = NodeSnapshot(
        node=NodeInfo(name="sample-node", labels={"env": "dev"}, driver_version="550.54", cordoned=False),
        jobs=[JobInfo(id="4242", name="train", user="alice", account="ml", partition="gpu", qos="normal",
                      gpus=[0], pids=[4242], started_at=now - 30 * hour, time_limit_s=48 * 3600)],
        gpus=[
            GpuInfo(node="sample-node", index=0, uuid="GPU-sample-0", model="NVIDIA H100 80GB HBM3", util_pct=0,
                    mem_used_mib=20000, mem_total_mib=81559, temp_c=45, power_w=90, power_limit_w=700, fan_pct=30,
                    ecc_uncorrected=0, idle=True, idle_since=now - 3 * hour, pids=[4242]),
            GpuInfo(node="sample-node", index=1, uuid="GPU-sample-1", model="NVIDIA H100 80GB HBM3", util_pct=97,
                    mem_used_mib=70000, mem_total_mib=81559, temp_c=88, power_w=650, power_limit_w=700, fan_pct=90),
        ],
        processes=[
            ProcessInfo(node="sample-node", pid=4242, name="train.py", cmdline="python train.py --epochs 90",
                        user="alice", uid=1000, create_time=now - 30 * hour, ppid=1, gpus=[0],
                        gpu_mem_mib=20000, gpu_util_pct=0, container_id="c0ffee", pod="ml/trainer-0",
                        labels={"app": "trainer"}, job="4242"),
        ],
    )
    change = state.apply(SnapshotEvent(source="node/sample-node", time=now, data=snap), now)
    assert change is not None
    out: dict[str, Entity] = {}
    for e in change.changed:
        out.setdefault(e.kind, e)
        if hasattr(e.view, "labels"):
            e.view.labels = SampleLabels(e.view.labels)
    out["node"].ctx["node"].labels = SampleLabels(out["node"].ctx["node"].labels)
    return out


def render_sample(rule: Rule, action: CompiledAction, sender: Sender, ent: Entity, now: datetime) -> dict[str, Any]:
    """The action's parameters rendered for the sample entity (raises what rendering or validation raises)."""
    inc = open_incident(rule.name, rule.hash, ent.id, ent.key, rule.kind, "default", "sample-node",
                        now - timedelta(hours=2))
    inc = step(inc, True, now - timedelta(hours=1), 0.0, None)
    params = render_params(action.params, sender.names(rule, ent, inc, now))
    registry.parse_params(action.type, params)
    return params


def check_rule_set(rules: RuleSet, config: Config | None = None) -> list[Located]:
    """Render every template of every rule against a sample of its kind; a problem per failing action."""
    cfg = config or Config()
    sender = Sender(cfg, Limiter())
    ents = sample_entities()
    problems = []
    for rule in rules:
        ent = ents[rule.kind]
        ent.ctx[next(k for k in ent.ctx if k.startswith("$"))].set(SAMPLE_NOW)
        for section, actions in (("actions", rule.actions), ("on_resolve", rule.on_resolve)):
            for a in actions:
                try:
                    render_sample(rule, a, sender, ent, SAMPLE_NOW)
                except Exception as e:
                    what = f"{type(e).__name__}: {e}" if not isinstance(e, registry.ParamsError) else str(e)
                    problems.append(Located(rule.file, a.line or rule.line,
                                            f"{rule.name}: {section}[{a.index}] ({a.type}) does not render "
                                            f"for a sample {rule.kind}: {what}"))
    return problems


def load_checked(paths: Sequence[Path | str], default_timezone: str = "UTC",
                 config: Config | None = None) -> RuleSet:
    """The rule set, loaded and checked exactly as `rules check` does; LocatedError with every problem otherwise
    (the engine loads and reloads through this, so it never runs a set that `rules check` rejects). With the
    engine's `config`, a staged remedy whose warnings have no channel configured is a problem too."""
    rules = load_rule_set(paths, default_timezone=default_timezone)
    problems = check_rule_set(rules, config)
    if config is not None:
        problems += channel_problems(rules, config)
    if problems:
        raise LocatedError(problems)
    return rules


def check_paths(paths: Sequence[Path | str], default_timezone: str = "UTC") -> tuple[RuleSet | None, list[Located]]:
    """Load and check; the rule set (None when it does not load) and every problem."""
    try:
        rules = load_rule_set(paths, default_timezone=default_timezone)
    except LocatedError as e:
        return None, e.problems
    return rules, check_rule_set(rules)
