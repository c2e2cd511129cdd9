"""A snooze or an owner's keep (`gpuevents snooze`, `gpuevents keep`, Slack's Keep form, an approved long keep),
asked of the engine on `gpuevents.engine.snooze`, and the engine's answer.

A keep (`keep=True`) is bounded by the rule's `snooze_max`. One asked for longer is kept for `snooze_max` at once
and the rest goes to the rule's approving channel (the `approve:` of its actions): approved, the engine keeps it
as asked; denied or unanswered, it stays at `snooze_max`. A rule that names no approving channel says so, and who
to ask. A snooze (`keep=False`: an operator, or an approved keep) is applied as asked.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from gpuevents.durations import format_duration

REASON_MAX = 500


class KeepRequest(BaseModel):
    """Exempt `entity_id` from `rule` until `until` (a time in the past lifts it), asked by `by` for `reason`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rule: str = Field(min_length=1)
    entity_id: str = Field(min_length=1)
    until: AwareDatetime
    by: str = Field(min_length=1, max_length=100)
    reason: str = Field("", max_length=REASON_MAX)
    keep: bool = Field(False, description="an owner's keep: at most the rule's snooze_max, longer by approval")
    approved_by: str = Field("", max_length=200, description="the rest of a keep past snooze_max, approved "
                             "(who, where): applied as asked, and counted as that keep's extension")

    @model_validator(mode="after")
    def _reason(self) -> KeepRequest:
        if self.keep and not self.reason.strip():
            raise ValueError("a keep needs a reason (`gpuevents keep ... --reason TEXT`, or the Slack form's)")
        return self


def keep_request(rule: str, entity_id: str, seconds: float, now: datetime, by: str, reason: str,
                 keep: bool) -> KeepRequest:
    """The request the command line and Slack both send: `seconds` from `now`."""
    return KeepRequest(rule=rule, entity_id=entity_id, until=now + timedelta(seconds=seconds), by=by,
                       reason=reason.strip(), keep=keep)


class KeepReply(BaseModel):
    """What the engine did: kept `until` (`asked_until` is what was asked); `approval`: the channel the rest of
    a longer keep awaits; `admins`: who to ask when the rule has no approving channel."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ok: bool = False  # a handler that raised answers {"error": ...} alone (gpuevents/bus)
    error: str | None = None
    until: datetime | None = None
    asked_until: datetime | None = None
    snooze_max_s: float | None = None
    approval: str | None = None
    admins: list[str] = Field(default_factory=list)
    budget: str | None = None  # "3 of 5 keeps this week" (this one counted), where a keep budget applies
    over_budget: str | None = None  # past the budget: nothing kept, the whole keep awaits `approval`

    @property
    def capped(self) -> bool:
        return self.until is not None and self.asked_until is not None and self.until < self.asked_until

    def note(self, asked_s: float, mention: Callable[[str], str] = str) -> str:
        """What the answer says beyond "kept until": "" when kept as asked. `mention` writes a person's id (Slack:
        `<@U…>`)."""
        if self.over_budget is not None:
            where = f"awaits approval in {self.approval}" if self.approval else "is not kept"
            return f"past the keep budget ({self.over_budget}): the keep {where}"
        if not self.capped:
            return self.budget or ""
        if self.budget:
            return f"{self.budget}; " + self._capped_note(asked_s, mention)
        return self._capped_note(asked_s, mention)

    def _capped_note(self, asked_s: float, mention: Callable[[str], str]) -> str:
        cap = format_duration(self.snooze_max_s or 0)
        asked = format_duration(asked_s)
        if self.approval:
            return (f"the rule's snooze_max is {cap}: kept for {cap} meanwhile; the {asked} asked for awaits "
                    f"approval in {self.approval}")
        who = ", ".join(mention(a) for a in self.admins) or "whoever runs gpuevents"
        return (f"this rule allows at most {cap} and names no approving channel: kept for {cap}; "
                f"for {asked} ask {who}")
