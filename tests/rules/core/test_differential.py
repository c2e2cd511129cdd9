"""Differential: the core as it runs gives what a core forced to rebuild and re-evaluate everything gives.

Random fleets (see `differential_inputs`: every input item kind the core accepts, on every entity kind) are fed
to two cores step by step: ours, and one whose every node is rebuilt and every entity evaluated at its next
event. In half of the sequences time also passes as the engine lets it (a tick at every `next_wakeup`), and the
full core then sweeps every rule that does not read the clock over every entity after each step: what the
incremental path skipped must have had nothing to change. After every step the two must agree on the
transitions (times and reasons), the incidents that changed, the action requests, the snoozes, the views of
every entity, the conditions that raised and the next wakeup.
`GPUEVENTS_PROPERTY_EXAMPLES` sets how many random sequences run (150 by default, derandomized; an exploring
run draws new ones).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from pprint import pformat
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rules.core.core import ActionOutcome, Core, Sweep, Tick
from rules.core.inputs import StepResult
from rules.lang.model import RuleSet
from rules.lang.views import FIELDS_OF
from tests.quick import examples
from tests.rules.core.differential_inputs import Item, Outcome, Reload, inputs
from tests.rules.helpers import at, config, rules_from

EXAMPLES = int(os.environ.get("GPUEVENTS_PROPERTY_EXAMPLES", "150"))
MAX_WAKEUPS = 300  # per sequence; past it, time jumps (as for an engine that fell behind) and the strict check stops

RULES = """\
rules:
  - name: held-idle
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 1m
    actions: [{type: log, message: "held {{ gpu.id }} by {{ gpu.owner }}"}]
  - name: hot
    entity: gpu
    when: gpu.temp_c is not none and gpu.temp_c > 80
    repeat: 2m
    actions: [{type: log, message: "hot {{ gpu.id }}"}]
  - name: alice-busy
    entity: gpu
    when: gpu.owner == 'alice' and not gpu.idle
    actions: [{type: log, message: "{{ gpu.owner }} {{ gpu.owners }}"}]
  - name: idle-long
    entity: gpu
    when: gpu.idle and gpu.idle_for_s > 300
    actions: [{type: log, message: "idle {{ gpu.id }}"}]
  - name: ghost
    entity: process
    when: >-
      process.ppid == 1 and gpus and (gpus | selectattr('idle') | list | length) == (gpus | length)
    actions: [{type: log, message: "ghost {{ process.pid }}"}]
  - name: old
    entity: process
    when: process.age_s > 600
    actions: [{type: log, message: "old {{ process.pid }}"}]
  - name: half-idle
    entity: node
    when: (gpus | selectattr('idle') | list | length) * 2 >= (gpus | length) and node.labels.pool == 'a'
    actions: [{type: log, message: "half {{ node.name }}"}]
  - name: tier
    entity: gpu
    when: node.labels.tier == 'gold'
    actions: [{type: log, message: "never"}]
  - name: agent-down
    entity: node
    when: not node.online
    for: 1m
    actions: [{type: log, message: "down {{ node.name }}"}]
  - name: xid-recent
    entity: gpu
    when: gpu.xid == 79 and gpu.xid_at is not none and gpu.xid_at > now - duration('5m')
    actions: [{type: log, message: "xid {{ gpu.id }}"}]
  - name: spread-idle
    entity: job
    when: job.nodes | length > 1 and job.idle
    actions: [{type: log, message: "{{ job.id }} {{ job.nodes }}"}]
  - name: job-idle-for
    entity: job
    when: job.idle
    for: 1m
    actions: [{type: log, message: "{{ job.id }}"}]
  - name: job-idle-long
    entity: job
    when: job.idle and job.idle_for_s > 120
    actions: [{type: log, message: "{{ job.id }}"}]

  - name: kube-idle
    entity: gpu
    when: gpu.idle and gpu.job is not none
    for: 1m
    actions:
      - {type: slack, to: "{{ gpu.owner }}", text: "idle {{ gpu.id }}"}
      - {type: kill, after: 2m}
  - name: wanted
    entity: gpu
    when: gpu.idle and demand.pending_gpus > 0
    actions: [{type: log, message: "wanted {{ gpu.id }} {{ demand.pending_gpus }}"}]
  - name: in-job
    entity: process
    when: process.job is not none and process.ppid == 1
    actions: [{type: log, message: "{{ process.pid }} {{ process.job }}"}]
  - name: job-kept
    entity: job
    when: job.exempt_until is not none or job.exemptions_malformed
    actions: [{type: log, message: "{{ job.id }} {{ job.exemption }}"}]
  - name: job-summary
    entity: job
    when: job.ended_at is not none
    actions: [{type: log, message: "{{ job.id }} {{ job.summary.gpu_hours }}"}]
  - name: every-10m
    entity: gpu
    schedule: "*/10 * * * *"
    when: gpu.idle
    actions: [{type: log, message: "scheduled {{ gpu.id }}"}]
"""

RULE_SETS = [
    RULES,
    # a reload: a threshold changed, a `for` changed, a rule removed
    RULES.replace("gpu.temp_c > 80", "gpu.temp_c > 85").replace("for: 1m\n    actions: [{type: log, message: \"held",
                                                              "for: 2m\n    actions: [{type: log, message: \"held")
    .replace("  - name: spread-idle\n", "  - name: spread-idle-2\n"),
    RULES.replace("  - name: kube-idle\n", "  - name: kube-idle-2\n")
    .replace("job.idle_for_s > 120", "job.idle_for_s > 60"),
]


def _value(v: Any) -> Any:
    if isinstance(v, list):
        return [_value(x) for x in v]
    if hasattr(v, "__slots__") and hasattr(v, "id"):
        return ("view", v.id)
    if isinstance(v, datetime):
        return v.isoformat()
    return v


def _views(core: Core) -> dict[str, dict[str, Any]]:
    return {key: {f: _value(getattr(e.view, f)) for f in sorted(FIELDS_OF[kind])}
            for kind, table in core.state.by_kind.items() for key, e in table.items()}


def _outcome(result: StepResult) -> dict[str, Any]:
    return {
        "transitions": sorted((tr.time, tr.rule, tr.entity_key, tr.from_status, tr.to_status, tr.reason)
                              for tr in result.transitions),
        "incidents": sorted(str(sorted(i.model_dump().items())) for i in result.incidents),
        "actions": sorted((a.key, a.type, a.rule, a.entity_id, a.phase, a.decision, str(a.params))
                          for a in result.actions),
        "snoozes": sorted(str(s) for s in result.snoozes),
        "errors": sorted((e.rule, e.message) for e in result.errors),  # (the entity named is the first to raise)
    }


_RULES_CACHE: dict[int, RuleSet] = {}


def _rules(tmp_path: Path, variant: int) -> RuleSet:
    if variant not in _RULES_CACHE:
        _RULES_CACHE[variant] = rules_from(tmp_path, RULE_SETS[variant], name=f"rules{variant}.yaml")
    return _RULES_CACHE[variant]


def _core(tmp_path: Path) -> Core:
    return Core(_rules(tmp_path, 0), config(tick="30s", offline_grace="2m"))


def _outcome_of(core: Core, item: Outcome) -> ActionOutcome | None:
    """The `index`-th warning an open incident sent (in a fixed order), with the drawn outcome."""
    sent = sorted((inc.id, key, inc.rule) for inc in core.open_incidents() for key in inc.warnings)
    if not sent:
        return None
    incident_id, key, rule = sent[item.index % len(sent)]
    return ActionOutcome(rule=rule, incident_id=incident_id, key=key, outcome=item.outcome)


def _run(core: Core, item: Item, now: datetime, extra: set[str] | None = None) -> StepResult:
    """One input as the engine gives it: a tick that leaves its sweep to slices is followed by them; with
    `extra`, the core then also sweeps these rules over every entity of their kind (the full re-evaluation)."""
    if isinstance(item, Reload):
        return core.replace_rules(_RULES_CACHE[item.variant], now)
    if isinstance(item, Outcome):
        found = _outcome_of(core, item)
        return core.step(found, now) if found is not None else StepResult()
    out = core.step(item, now)
    for name in out.sweeps:
        rule = core.plan.by_name[name]
        keys = tuple(core.state.by_kind[rule.kind])
        for part in (keys[: len(keys) // 2], keys[len(keys) // 2:]):
            out.extend(core.step(Sweep(rule=name, keys=part, rule_hash=rule.hash), now))
    for name in sorted(extra or ()):
        maybe = core.plan.by_name.get(name)
        if maybe is not None and not maybe.scheduled and not maybe.condition.time_dependent:
            out.extend(core.step(Sweep(rule=name, keys=tuple(core.state.by_kind[maybe.kind])), now))
    return out


def _only(a: Any, b: Any) -> list[Any]:
    """What `a` has that `b` has not (ours, then the full core's, in an assertion's message)."""
    bl = list(b)
    return [x for x in a if x not in bl]


def _compare(ours: Core, full: Core, item: Any, now: datetime, strict: bool) -> None:
    for ns in full.state.nodes.values():
        ns.skipped()  # rebuild every view of every node and evaluate every entity at its next event
    a = _run(ours, item, now)
    b = _run(full, item, now, set(full.plan.by_name) if strict else None)
    oa, ob = _outcome(a), _outcome(b)
    if oa != ob:
        pytest.fail(f"at {now} after {item!r}:\n" + pformat(
            {k: {"ours only": _only(oa[k], ob[k]), "full only": _only(ob[k], oa[k])} for k in oa if oa[k] != ob[k]}))
    va, vb = _views(ours), _views(full)
    if va != vb:
        pytest.fail(f"views at {now} after {item!r}:\n" + pformat(
            {k: {"ours only": _only(va.get(k, {}).items(), vb.get(k, {}).items()),
                 "full only": _only(vb.get(k, {}).items(), va.get(k, {}).items())}
             for k in va.keys() | vb.keys() if va.get(k) != vb.get(k)}))
    assert sorted(ours.error_counts) == sorted(full.error_counts)
    assert ours.next_wakeup(now) == full.next_wakeup(now), (now, item)


@settings(max_examples=examples(EXAMPLES), deadline=None, derandomize=not os.environ.get("GPUEVENTS_PROPERTY_EXAMPLES"),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
          phases=[p for p in Phase if p != Phase.shrink or not os.environ.get("GPUEVENTS_NO_SHRINK")])
@given(items=inputs(), wake=st.booleans())
def test_the_incremental_core_gives_what_a_full_re_evaluation_gives(
    tmp_path: Path, items: list[tuple[float, Item]], wake: bool,
) -> None:
    for v in range(len(RULE_SETS)):
        _rules(tmp_path, v)
    ours, full = _core(tmp_path), _core(tmp_path)
    last = at(0)
    wakeups = 0
    for t, item in items:
        now = at(t)
        while wake and wakeups < MAX_WAKEUPS and (w := ours.next_wakeup(last)) <= now:
            _compare(ours, full, Tick(), w, strict=True)
            last = w
            wakeups += 1
        # (a reload evaluates its new and changed rules at the tick it asks for at once, not at the reload)
        _compare(ours, full, item, now, strict=wake and wakeups < MAX_WAKEUPS and not isinstance(item, Reload))
        last = now
    assert sorted(str(i) for i in ours.open_incidents()) == sorted(str(i) for i in full.open_incidents())
