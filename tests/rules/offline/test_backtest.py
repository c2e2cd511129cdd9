"""The backtest streams: each stored event is stepped as it is read (nothing is held), at its own time, with the
ticks the core asks for in between."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from gpuevents.bus import StoredMsg
from gpuevents.events import encode_event
from gpuevents.records import AuditRecord, audit_messages
from rules.core.core import Core
from rules.offline.backtest import StreamSummary, coverage_note, stream_backtest, summarize, warning_outcomes
from tests.rules.engine.conftest import IDLE_RULES, T0, snapshot
from tests.rules.helpers import rules_from


async def test_events_are_stepped_as_they_are_read_and_rules_fire_on_time(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, IDLE_RULES)
    core = Core(rules)
    summary = StreamSummary(T0)
    read_ahead: list[int] = []

    async def messages() -> AsyncIterator[StoredMsg]:
        for i in range(240):  # two hours of one node at 30 s
            at = T0 + timedelta(seconds=30 * i)
            # what was read before is already applied: the backtest holds no window of events
            read_ahead.append(i - summary.rec.steps)
            yield StoredMsg("gpuevents.evt.c1.n1.node.snapshot", encode_event(snapshot("n1", at, idle_since=T0)), i,
                            at)

    events, malformed = await stream_backtest(core, messages(), T0, T0 + timedelta(hours=2), summary)
    assert (events, malformed) == (240, 0)
    assert max(read_ahead) <= 1
    report = summarize(summary.rec, ["idle-gpu-1h"], T0, T0 + timedelta(hours=2), events, malformed)
    (incident,) = report.incidents
    assert abs((incident.fired_at - (T0 + timedelta(hours=1))).total_seconds()) <= 30


def test_the_report_notes_a_window_with_no_events_or_events_only_late() -> None:
    end = T0 + timedelta(days=14)
    assert coverage_note(T0, end, None, 0).startswith("the window holds no events, so no rule could fire")
    late = coverage_note(T0, end, end - timedelta(hours=2), 500)
    assert late.startswith("events only from ") and "13d 22h before holds none" in late
    assert coverage_note(T0, end, T0 + timedelta(minutes=5), 500) == ""  # covered: nothing to say


WARN_THEN_KILL = """\
rules:
  - name: warn-then-kill
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 1h
    actions:
      - {type: slack, to: "{{ gpu.owner }}", text: "idle; ended in 30m"}
      - {type: kill, after: 30m}
"""


async def _idle_node(summary: StreamSummary, tmp_path: Path) -> None:
    async def messages() -> AsyncIterator[StoredMsg]:
        for i in range(200):  # 1h40m of one node at 30 s
            at = T0 + timedelta(seconds=30 * i)
            yield StoredMsg("gpuevents.evt.c1.n1.node.snapshot", encode_event(snapshot("n1", at, idle_since=T0)), i,
                            at)

    await stream_backtest(Core(rules_from(tmp_path, WARN_THEN_KILL)), messages(), T0, T0 + timedelta(minutes=100),
                          summary)


async def test_a_warning_the_live_runners_did_not_deliver_refuses_the_stage_as_the_engine_did(
        tmp_path: Path) -> None:
    """The live engine refused the kill because its Slack warning was only printed (refused) or failed; the
    backtest reads that outcome from the audit stream by the warning's key (the same events make the same key)
    and decides the stage the same way, instead of showing `stage: kill` as run."""
    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
    first = StreamSummary(T0)
    await _idle_node(first, tmp_path / "a")
    (slack,) = [a for a in first.rec.actions if a.type == "slack"]
    audit = [AuditRecord(time=T0 + timedelta(hours=1), kind="action", rule="warn-then-kill", action_type="slack",
                         action_key=slack.key, outcome=outcome, entity_id=slack.entity_id)
             for outcome in ("failed", "refused")]

    async def stored() -> AsyncIterator[StoredMsg]:
        for i, m in enumerate(audit_messages(audit)):
            yield StoredMsg(m.subject, m.payload, i, T0)

    known = await warning_outcomes(stored())
    assert known == {slack.key: "refused"}
    summary = StreamSummary(T0, known)
    await _idle_node(summary, tmp_path / "b")
    decided = [(a.phase, a.type, a.decision) for a in summary.rec.actions]
    assert decided == [("fire", "slack", "run"), ("stage", "kill", "refused")]
    (kill,) = [a for a in summary.rec.actions if a.type == "kill"]
    assert "its warning was not delivered" in (kill.reason or "")


async def test_a_backtest_takes_warnings_as_delivered_so_staged_actions_show_as_run(tmp_path: Path) -> None:
    rules = rules_from(tmp_path, """\
rules:
  - name: warn-then-kill
    entity: gpu
    when: gpu.idle and gpu.processes
    for: 1h
    actions:
      - {type: slack, to: "{{ gpu.owner }}", text: "idle; ended in 30m"}
      - {type: kill, after: 30m}
""")
    core = Core(rules)
    summary = StreamSummary(T0)

    async def messages() -> AsyncIterator[StoredMsg]:
        for i in range(200):  # 1h40m of one node at 30 s
            at = T0 + timedelta(seconds=30 * i)
            yield StoredMsg("gpuevents.evt.c1.n1.node.snapshot", encode_event(snapshot("n1", at, idle_since=T0)), i,
                            at)

    await stream_backtest(core, messages(), T0, T0 + timedelta(minutes=100), summary)
    decided = [(a.phase, a.type, a.decision) for a in summary.rec.actions]
    assert decided == [("fire", "slack", "run"), ("stage", "kill", "run")]
