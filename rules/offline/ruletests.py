"""Rule unit tests (DESIGN §4): YAML test files run on a virtual clock through the core, actions recorded.

A test's run may restart the engine (`restarts:`): the next core starts from what the engine persists
(incidents, snoozes, rate-limit windows), knows no node, and each node's current snapshot reaches it again
15 s later, as the agent's next heartbeat would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from actions import registry
from gpuevents.costs import CostModel
from gpuevents.durations import format_duration
from gpuevents.events import DemandEvent, SnapshotEvent
from gpuevents.records import ActionRequest, Phase
from gpuevents.yamlpos import Located, LocatedError
from rules.core.core import Core, CoreInput, ForgetNode
from rules.lang.loader import load_rule_set
from rules.lang.model import RuleSet
from rules.offline.replay import RAN, Recording, replay
from rules.offline.testfile import (
    Expectation,
    ExpectedAction,
    RuleTest,
    TestFile,
    job_end_inputs,
    load_test_file,
    snapshot_inputs,
    start_of,
)

HEARTBEAT_AFTER_RESTART_S = 15.0
JOB_GAP_S = 365 * 86400.0
"""A test's snapshot holds until the node's next one, however far: its jobs' use is counted all that time."""


@dataclass
class TestOutcome:
    name: str
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class FileOutcome:
    path: str
    tests: list[TestOutcome] = field(default_factory=list)
    problems: list[Located] = field(default_factory=list)

    @property
    def invalid(self) -> bool:
        return bool(self.problems)

    @property
    def passed(self) -> bool:
        return not self.invalid and all(t.passed for t in self.tests)


def run_with_restarts(rules: RuleSet, tf: TestFile, inputs: list[tuple[datetime, CoreInput]], start: datetime,
                      end: datetime, restarts: list[datetime]) -> Recording:
    """Replay `inputs` through a core that is replaced at each of `restarts` by one restored from what the
    engine persists; after each restart every node's current snapshot comes again, 15 s later."""
    config = tf.run_config()
    core = Core(rules, config, offline_detection=False)
    rec = Recording(start=start)
    todo = sorted(inputs, key=lambda x: x[0])
    current: dict[str, SnapshotEvent | DemandEvent] = {}  # node -> its latest snapshot (or demand) so far
    t0 = start
    for at in sorted(r for r in restarts if start <= r < end):
        before = [x for x in todo if x[0] < at]
        todo = [x for x in todo if x[0] >= at]
        replay(core, before, start=t0, end=at - timedelta(microseconds=1), recording=rec)
        for _, item in before:
            if isinstance(item, SnapshotEvent | DemandEvent):  # the demand reader reports again, too
                current[item.node] = item
            elif isinstance(item, ForgetNode):
                current.pop(item.node, None)
        windows = core.limiter.windows(at.timestamp())
        incidents, snoozes = core.open_incidents(), list(core.snoozes.values())
        core = Core(rules, config, offline_detection=False)
        core.restore(incidents, snoozes, now=at, limits=windows)
        again = at + timedelta(seconds=HEARTBEAT_AFTER_RESTART_S)
        todo += [(again, snap.model_copy(update={"time": again})) for snap in current.values()]
        todo.sort(key=lambda x: x[0])
        t0 = at
    replay(core, todo, start=t0, end=end, recording=rec)
    return rec


def run_test(tf: TestFile, test: RuleTest, rule_paths: list[Path]) -> TestOutcome:
    rules = load_rule_set(rule_paths, default_timezone=tf.timezone)
    config = tf.run_config()
    start = start_of(tf, test)
    th = config.agent.thresholds
    inputs = snapshot_inputs(test, start, tf.owners, th.idle_util_pct, thresholds=th)
    inputs += job_end_inputs(inputs, CostModel(config.costs), JOB_GAP_S)
    expected = [x for e in test.expect for x in (e.fires_at, e.resolves_at) if x is not None]
    expected += [s.at for e in test.expect for s in e.staged or ()]
    last = max([s.at for s in test.snapshots] + expected + list(test.restarts) + [0.0])
    # a tick past the last instant of interest: "within one tick after" must be observable at the very end
    end = start + timedelta(seconds=last + rules.longest_for_s + tf.tick)
    restarts = [start + timedelta(seconds=r) for r in test.restarts]
    rec = run_with_restarts(rules, tf, inputs, start, end, restarts)
    outcome = TestOutcome(test.name)
    known = set(rules.by_name)
    for exp in test.expect:
        if exp.rule not in known:
            outcome.failures.append(f"expect: rule {exp.rule!r} is not in the loaded rule files")
            continue
        problems = check_expectation(exp, rec, tf.tick)
        if problems:
            lines = [f"{exp.rule} on {exp.entity}:"] + [f"  {p}" for p in problems]
            lines.append("  timeline:")
            lines += [f"    {row}" for row in rec.timeline(exp.rule, exp.entity)]
            outcome.failures.append("\n".join(lines))
    return outcome


def _fmt(seconds: float) -> str:
    return format_duration(seconds).replace(" ", "")


def check_actions(want: list[str | ExpectedAction], acts: list[ActionRequest], phase: Phase,
                  what: str) -> list[str]:
    """Compare one occasion's requests (the first incident's `phase`) with the expected items: items whose
    outcome is `run` are the actions run, in order; each other item must match a request of its type that was
    decided so on that occasion."""
    first = next((a for a in acts if a.phase == phase), None)
    occasion = [a for a in acts if first is not None and a.incident_id == first.incident_id and a.phase == phase]
    return check_occasion(want, occasion, what)


def check_occasion(want: list[str | ExpectedAction], occasion: list[ActionRequest], what: str) -> list[str]:
    """Compare the requests of one occasion with the expected items (see `check_actions`)."""
    ran = sorted((a for a in occasion if a.decision in RAN), key=lambda a: a.index)
    runs = [w for w in want if isinstance(w, str) or w.outcome == "run"]
    others = [w for w in want if isinstance(w, ExpectedAction) and w.outcome != "run"]
    out: list[str] = []
    names, got = [w if isinstance(w, str) else w.type for w in runs], [a.type for a in ran]
    if names != got:
        detail = "; ".join(f"{a.type} {a.decision}" + (f" ({a.reason})" if a.reason else "") for a in occasion)
        out.append(f"expected actions run at {what}: {names}; actual: {got}" + (f" [{detail}]" if detail else ""))
    else:
        for w, a in zip(runs, ran, strict=True):
            if isinstance(w, ExpectedAction):
                out += _param_problems(w, a)
    for w in others:
        decided = [a for a in occasion if a.type == w.type and a.decision == w.outcome]
        if not any(not _param_problems(w, a) for a in decided):
            actual = ", ".join(f"{a.type} {a.decision}" for a in occasion) or "none"
            out.append(f"expected a {w.type} decided {w.outcome} at {what}; actual: {actual}")
    return out


def _param_problems(w: ExpectedAction, a: ActionRequest) -> list[str]:
    params = registry.readable(a.type, a.params)
    return [f"expected {a.type}.{k} = {v!r}; actual: {params.get(k, '(not set)')!r}"
            for k, v in w.params().items() if params.get(k, _MISSING) != v]


def check_expectation(exp: Expectation, rec: Recording, tick: float) -> list[str]:
    """What differs between an expectation and a recorded run (empty when it holds)."""
    trans = rec.transitions_of(exp.rule, exp.entity)
    fired = [t for t in trans if t.to_status == "firing"]
    resolved = [t for t in trans if t.to_status == "resolved"]
    out: list[str] = []
    if exp.never:
        if fired:
            out.append(f"expected: never fires; actual: fired at {rec.offset(fired[0].time)}")
        return out

    def within(expected: float, actual: datetime) -> bool:
        off = (actual - rec.start).total_seconds()
        return expected <= off <= expected + tick

    if exp.fires_at is not None:
        if not fired:
            out.append(f"expected: fires at +{_fmt(exp.fires_at)}; actual: never fired")
        elif not within(exp.fires_at, fired[0].time):
            out.append(f"expected: fires at +{_fmt(exp.fires_at)} (within one tick, {_fmt(tick)}); "
                       f"actual: fired at {rec.offset(fired[0].time)}")
    if exp.resolves_at is not None:
        if not resolved:
            out.append(f"expected: resolves at +{_fmt(exp.resolves_at)}; actual: never resolved")
        elif not within(exp.resolves_at, resolved[0].time):
            out.append(f"expected: resolves at +{_fmt(exp.resolves_at)} (within one tick); "
                       f"actual: resolved at {rec.offset(resolved[0].time)}")
    acts = rec.actions_of(exp.rule, exp.entity)
    if exp.actions is not None:
        out += check_actions(exp.actions, acts, "fire", "the first firing")
    if exp.resolve_actions is not None:
        out += check_actions(exp.resolve_actions, acts, "resolve", "the first resolution")
    if exp.staged is not None:
        out += _check_staged(exp, acts, rec, within)
    if exp.count is not None:
        occasions = {(a.incident_id, a.phase, a.repeat) for a in acts
                     if a.phase in ("fire", "repeat") and a.decision in RAN}
        if len(occasions) != exp.count:
            out.append(f"expected: actions ran {exp.count} time(s); actual: {len(occasions)}")
    if (exp.fires_at is None and exp.count is None and exp.actions is None and exp.resolves_at is None
            and exp.resolve_actions is None and not fired):
        out.append("expected: fires; actual: never fired")
    return out


def _check_staged(exp: Expectation, acts: list[ActionRequest], rec: Recording,
                  within: Callable[[float, datetime], bool]) -> list[str]:
    """The staged actions of the first incident that ran any, stage by stage: when, and what."""
    assert exp.staged is not None
    staged = [a for a in acts if a.phase == "stage"]
    first = staged[0].incident_id if staged else None
    by_time: dict[datetime, list[ActionRequest]] = {}
    for a in staged:
        if a.incident_id == first:
            by_time.setdefault(a.created_at, []).append(a)
    occasions = sorted(by_time.items())
    out: list[str] = []
    if len(occasions) != len(exp.staged):
        when = ", ".join(rec.offset(t) for t, _ in occasions) or "none"
        out.append(f"expected {len(exp.staged)} stage(s) of staged actions; actual: {len(occasions)} ({when})")
    for want, (t, occasion) in zip(exp.staged, occasions, strict=False):
        if not within(want.at, t):
            out.append(f"expected a stage at +{_fmt(want.at)} (within one tick); actual: {rec.offset(t)}")
        out += check_occasion(want.actions, occasion, f"the stage at +{_fmt(want.at)}")
    return out


_MISSING: Any = object()


def run_test_file(path: Path) -> FileOutcome:
    """Run every test of one file; `problems` when the file or its rules are invalid (exit code 2)."""
    result = FileOutcome(str(path))
    try:
        tf = load_test_file(path)
        rule_paths = [(path.parent / p) for p in tf.rule_files]
        load_rule_set(rule_paths, default_timezone=tf.timezone)
    except LocatedError as e:
        result.problems = e.problems
        return result
    for test in tf.tests:
        result.tests.append(run_test(tf, test, rule_paths))
    return result
