"""Rule unit tests (DESIGN §4): YAML test files run on a virtual clock through the core, actions recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gpuevents.clock import utc
from gpuevents.config import Config
from gpuevents.durations import Duration, format_duration
from gpuevents.events import GpuInfo, NodeInfo, NodeSnapshot, ProcessInfo, SnapshotEvent
from gpuevents.yamlpos import Located, LocatedError, parse_yaml
from rules.core.core import Core, CoreInput, ForgetNode
from rules.lang import calendars
from rules.lang.loader import load_rule_set
from rules.offline.replay import RAN, Recording, replay

DEFAULT_START = "2026-01-05T00:00:00"
DEFAULT_MEM_TOTAL_MIB = 81559.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TestGpu(_Strict):
    index: int
    util_pct: float = 0
    mem_used_mib: float = 0
    mem_total_mib: float = DEFAULT_MEM_TOTAL_MIB
    idle: bool | None = None
    idle_for: Duration | None = Field(None, description="idle since `at - idle_for` (extension)")
    uuid: str = ""
    model: str | None = None
    mem_pct: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    ecc_uncorrected: int | None = None
    mig_parent: str | None = None
    lost: bool = False
    pids: list[int] = Field(default_factory=list)


class TestProcess(_Strict):
    pid: int
    user: str | None = None
    gpus: list[int] = Field(default_factory=list)
    age: Duration | None = None
    create_time: datetime | None = None
    name: str = ""
    cmdline: str = ""
    uid: int | None = None
    owner: str | None = None
    ppid: int | None = None
    gpu_mem_mib: float | None = None
    gpu_util_pct: float | None = None
    container_id: str | None = None
    pod: str | None = None
    pod_uid: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)


class TestSnapshot(_Strict):
    at: Duration
    node: str
    cluster: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: list[TestGpu] = Field(default_factory=list)
    processes: list[TestProcess] = Field(default_factory=list)
    gone: bool = False
    cordoned: bool | None = None
    driver_version: str | None = None


class ExpectedAction(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    type: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Expectation(_Strict):
    rule: str
    entity: str
    fires_at: Duration | None = None
    resolves_at: Duration | None = None
    actions: list[str | ExpectedAction] | None = None
    count: int | None = Field(None, ge=0)
    never: bool = False


class RuleTest(_Strict):
    name: str
    start: datetime | str | None = Field(None, description="overrides the file's `start` (extension)")
    snapshots: list[TestSnapshot] = Field(default_factory=list)
    expect: list[Expectation] = Field(default_factory=list)


class TestFile(_Strict):
    rule_files: list[str] = Field(min_length=1)
    timezone: str = "UTC"
    start: datetime | str = DEFAULT_START
    tick: Duration = 30
    owners: dict[str, str] = Field(default_factory=dict)
    tests: list[RuleTest] = Field(min_length=1)

    @field_validator("tick")
    @classmethod
    def _tick(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("must be longer than 0s")
        return v


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


def load_test_file(path: Path) -> TestFile:
    """Parse and validate a test file; LocatedError on any problem."""
    try:
        text = path.read_text()
    except OSError as e:
        raise LocatedError([Located(str(path), 0, f"cannot read: {e.strerror}")]) from None
    doc = parse_yaml(text, str(path))
    if not isinstance(doc.data, dict):
        raise LocatedError([doc.locate((), "a rule test file is a mapping with rule_files and tests")])
    try:
        tf = TestFile.model_validate(doc.data)
    except ValidationError as e:
        raise LocatedError(doc.validation_problems(e)) from None
    try:
        calendars.zone(tf.timezone)
    except calendars.CalendarError as e:
        raise LocatedError([doc.locate(("timezone",), f"timezone: {e}")]) from None
    return tf


def _start(tf: TestFile, test: RuleTest) -> datetime:
    tz = calendars.zone(tf.timezone)
    raw = test.start if test.start is not None else tf.start
    start = raw if isinstance(raw, datetime) else datetime.fromisoformat(str(raw))
    aware = start.replace(tzinfo=tz) if start.tzinfo is None else start
    return utc(aware)  # offsets are elapsed time: add them in UTC, not on the local wall clock


def snapshot_inputs(test: RuleTest, start: datetime, owners: dict[str, str]) -> list[tuple[datetime, CoreInput]]:
    """The snapshots of a test as core inputs: defaults filled, idle derived, create times from `age`."""
    out: list[tuple[datetime, CoreInput]] = []
    created: dict[tuple[str, int], datetime] = {}
    for snap in sorted(test.snapshots, key=lambda s: s.at):
        at = start + timedelta(seconds=snap.at)
        if snap.gone:
            out.append((at, ForgetNode(node=snap.node, cluster=snap.cluster)))
            continue
        gpus = []
        for g in snap.gpus:
            idle = g.idle if g.idle is not None else g.util_pct < 5
            fields = g.model_dump(exclude={"idle", "idle_for"})
            since = at - timedelta(seconds=g.idle_for) if (idle and g.idle_for is not None) else None
            gpus.append(GpuInfo(node=snap.node, idle=idle, idle_since=since, **fields))
        procs = []
        for p in snap.processes:
            if p.create_time is not None:
                ct = p.create_time
            elif p.age is not None:
                ct = at - timedelta(seconds=p.age)
            else:
                ct = created.get((snap.node, p.pid), at)
            created[(snap.node, p.pid)] = ct
            fields = p.model_dump(exclude={"age", "create_time", "owner"})
            owner = p.owner or (owners.get(p.user, p.user) if p.user else None)
            procs.append(ProcessInfo(node=snap.node, create_time=ct, owner=owner, **fields))
        node = NodeInfo(name=snap.node, cluster=snap.cluster, labels=snap.labels, gpu_count=len(gpus),
                        cordoned=snap.cordoned, driver_version=snap.driver_version)
        event = SnapshotEvent(source=f"node/{snap.node}", cluster=snap.cluster, time=at,
                              data=NodeSnapshot(node=node, gpus=gpus, processes=procs))
        out.append((at, event))
    return out


def run_test(tf: TestFile, test: RuleTest, rule_paths: list[Path]) -> TestOutcome:
    rules = load_rule_set(rule_paths, default_timezone=tf.timezone)
    config = Config.model_validate({"engine": {"timezone": tf.timezone, "tick": tf.tick}, "owners": tf.owners})
    core = Core(rules, config, offline_detection=False)
    start = _start(tf, test)
    inputs = snapshot_inputs(test, start, tf.owners)
    expected = [x for e in test.expect for x in (e.fires_at, e.resolves_at) if x is not None]
    last = max([s.at for s in test.snapshots] + expected + [0.0])
    end = start + timedelta(seconds=last + rules.longest_for_s)
    rec = replay(core, inputs, start=start, end=end)
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
        first = next((a for a in acts if a.phase == "fire"), None)
        ran = [a for a in acts if first is not None and a.incident_id == first.incident_id and a.phase == "fire"
               and a.decision in RAN]
        ran.sort(key=lambda a: a.index)
        want = [a if isinstance(a, str) else a.type for a in exp.actions]
        got = [a.type for a in ran]
        if want != got:
            detail = "; ".join(f"{a.type} {a.decision}" + (f" ({a.reason})" if a.reason else "")
                               for a in acts if a.phase == "fire")
            out.append(f"expected actions at the first firing: {want}; actual: {got}"
                       + (f" [{detail}]" if detail and got != want else ""))
        else:
            for w, a in zip(exp.actions, ran, strict=True):
                if isinstance(w, ExpectedAction):
                    for k, v in w.params().items():
                        if a.params.get(k, _MISSING) != v:
                            out.append(f"expected {a.type}.{k} = {v!r}; actual: {a.params.get(k, '(not set)')!r}")
    if exp.count is not None:
        occasions = {(a.incident_id, a.phase, a.repeat) for a in acts if a.phase in ("fire",
                                                                                     "repeat") and a.decision in RAN}
        if len(occasions) != exp.count:
            out.append(f"expected: actions ran {exp.count} time(s); actual: {len(occasions)}")
    if exp.fires_at is None and exp.count is None and exp.actions is None and exp.resolves_at is None and not fired:
        out.append("expected: fires; actual: never fired")
    return out


_MISSING = object()


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
