"""The `keep` action's parameters: the rest of an owner's keep past the rule's `snooze_max`, asked of the rule's
approving channel (`approve:`); made by the engine (rules/core/keeps.py), never written in rules. Runtime
actions.builtin.keep."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field

from actions.protocol import Action, ActionParams
from actions.registry import register


class KeepParams(ActionParams):
    type: Literal["keep"] = "keep"
    until: AwareDatetime
    by: str = Field(min_length=1)
    asked_reason: str = Field(min_length=1)
    reason: str = ""  # the question the approving channel was asked


@register
class KeepSpec(Action[KeepParams]):
    type: ClassVar[str] = "keep"
    params = KeepParams
    runtime: ClassVar[str | None] = "actions.builtin.keep:KeepAction"
    engine_only: ClassVar[str] = ("the engine asks it for an owner's keep past the rule's snooze_max; to let owners "
                                  "keep, give a slack action `buttons: {keep: [4h, 24h]}`")
