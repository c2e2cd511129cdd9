"""Warn before you act (DESIGN §5): a staged destructive action runs only if a warning of its incident was delivered.

A warning is a `slack`, `email` or `notify` action an incident sent before the stage (at firing, at a repeat or
at an earlier stage). Each is recorded on the incident (`Incident.warnings`, persisted with it) when it is
decided: `sent` when it went to a runner, `delivered` for a dry run, or the decision that stopped it (`refused`,
`suppressed`, `held`). The runner's final outcome comes back as an `ActionOutcome` input (the engine feeds the
audit stream's action records to the core): `ok` makes it `delivered`, `failed`, `refused` or `expired` say so.

When the stage comes due, the destructive actions in it (`kill`, `cancel`, `cordon`, `scale`, …) run only if
at least one of the incident's warnings is `delivered`; otherwise they are decided `refused` ("its warning was
not delivered"). A warning still `sent` then (no outcome known: still retrying, or its record lost) counts as not
delivered: where the engine cannot tell, it does not act. An incident that sent no warning, and an action with
`require_warning: false`, are not concerned.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from gpuevents.records import ActionRequest, Outcome
from rules.core.book import IncidentBook
from rules.core.incidents import Incident, SentWarning, WarningStatus
from rules.core.inputs import WARNING_TYPES, ActionOutcome, PendingSend, StepResult

__all__ = ["WARNING_TYPES", "ActionOutcome", "SentWarning", "WarningStatus"]


class _Stepper(Protocol):
    def step(self, item: Any, now: datetime) -> StepResult: ...


NOT_DELIVERED = "its warning was not delivered"

_STATUS: dict[str, WarningStatus] = {
    "ok": "delivered", "dry_run": "delivered",  # a dry run counts as run (DESIGN §4)
    "run": "sent",
    "refused": "refused", "failed": "failed", "expired": "expired", "suppressed": "suppressed", "held": "held",
}


def _status(decision_or_outcome: str) -> WarningStatus:
    status = _STATUS.get(decision_or_outcome)
    assert status is not None, decision_or_outcome
    return status


def undelivered(incident: Incident) -> str | None:
    """Why a staged destructive action of `incident` must not run now, or None: no warning was sent, or one
    was delivered."""
    if not incident.warnings or any(w.status == "delivered" for w in incident.warnings.values()):
        return None
    told = ", ".join(f"{w.type} {'with no outcome known' if w.status == 'sent' else w.status}"
                     for w in incident.warnings.values())
    return f"{NOT_DELIVERED} ({told})"


class WarningLedger:
    """The one writer of the incidents' warnings: what each warning became, from its decision to the runner's
    outcome. The warnings live on the incidents (persisted with them); the book keeps the incidents."""

    __slots__ = ("_book",)

    def __init__(self, book: IncidentBook) -> None:
        self._book = book

    def record_sent(self, send: PendingSend, requests: list[ActionRequest], out: StepResult) -> None:
        """Note on the incident the warnings among `requests` (a fire, repeat or stage phase) and their
        decisions."""
        if send.phase == "resolve":
            return
        sent = {r.key: SentWarning(type=r.type, status=_status(r.decision)) for r in requests
                if r.type in WARNING_TYPES and not r.destructive}
        if not sent:
            return
        current = self._book.incidents.get(send.rule.name, {}).get(send.incident.entity_key)
        if current is None or current.id != send.incident.id:
            return  # closed in the same step: nothing will be staged after it
        self._update(current.model_copy(update={"warnings": {**current.warnings, **sent}}), out)

    def apply_outcome(self, item: ActionOutcome, out: StepResult) -> None:
        """Record a runner's outcome of one of an open incident's warnings (`ok` wins over any other)."""
        incs = self._book.incidents.get(item.rule)
        if not incs:
            return
        inc = next((i for i in incs.values() if i.id == item.incident_id), None)
        if inc is None or item.key not in inc.warnings:
            return
        known = inc.warnings[item.key]
        status = _status(item.outcome)
        if known.status == status or known.status == "delivered":
            return
        updated = {**inc.warnings, item.key: known.model_copy(update={"status": status})}
        self._update(inc.model_copy(update={"warnings": updated}), out)

    def _update(self, updated: Incident, out: StepResult) -> None:
        self._book.update(updated)
        for i, inc in enumerate(out.incidents):
            if inc.id == updated.id:
                out.incidents[i] = updated
        if not any(inc is updated for inc in out.incidents):
            out.incidents.append(updated)


def assume_delivered(core: _Stepper, result: StepResult, now: datetime,
                     known: Mapping[str, Outcome] | None = None) -> None:
    """Report every warning `result` sent to a runner as the runner ended it: its outcome in `known` (what the
    live runners recorded for that key: a backtest reads them from the audit stream, so a warning that failed
    then fails here, and the stage after it is refused as the engine refused it), else delivered (rule tests,
    a warning no runner ever got), where a warning is undelivered only when the engine itself decided so."""
    for a in result.actions:
        if a.decision == "run" and a.type in WARNING_TYPES and not a.destructive and a.phase != "resolve":
            outcome = (known or {}).get(a.key, "ok")
            core.step(ActionOutcome(rule=a.rule, incident_id=a.incident_id, key=a.key, outcome=outcome), now)


FINAL: frozenset[str] = frozenset({"ok", "failed", "refused", "expired"})
"""A runner's outcomes of a warning it got (held, suppressed and dry runs are the engine's own decisions)."""


def remember_outcome(known: dict[str, Outcome], key: str, outcome: Outcome) -> None:
    """Keep a runner's outcome of a warning: `ok` wins over any other, as in `WarningLedger.apply_outcome`."""
    if outcome in FINAL and known.get(key) != "ok":
        known[key] = outcome
