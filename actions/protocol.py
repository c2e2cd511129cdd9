"""The action protocol: what every action (built-in or plugin) declares and how it is run."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

# Re-exported for plugins: `from actions.protocol import no_escape`.
from actions.escaping import UnsafeValue as UnsafeValue
from actions.escaping import no_escape as no_escape
from gpuevents.records import ActionRequest, ActionUnit, EntityKind

if TYPE_CHECKING:
    from gpuevents.config import Config

ALL_KINDS: frozenset[EntityKind] = frozenset({"node", "gpu", "process", "job"})
UNITS: frozenset[ActionUnit] = frozenset({"entity", "node"})


class ActionParams(BaseModel):
    """Base of every action's parameters; `type` is the discriminator."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: str


class ActionResult(BaseModel):
    """What `run` returns: `ok`, or `failed`/`refused` with the reason, plus details for the audit."""

    status: Literal["ok", "failed", "refused"] = "ok"
    detail: str = ""
    data: dict[str, Any] = {}


class TransientError(Exception):
    """Worth retrying (a 5xx, a timeout, a lost connection); `delay` overrides the backoff."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """Retrying will not help (a 4xx, an unknown user, a bad parameter)."""


class Deferred(Exception):
    """Not now: come back after `delay` seconds. Not a failure, not an attempt, not audited.

    The Slack digest uses it: the first message of a window waits for the window to close.
    """

    def __init__(self, delay: float, why: str = "") -> None:
        super().__init__(why or f"deferred for {delay:.0f}s")
        self.delay = delay


@dataclass
class ActionContext:
    """Everything an action may use while it runs."""

    request: ActionRequest
    params: ActionParams
    config: Config
    services: dict[str, Any] = field(default_factory=dict)  # bus, kv, http session, clients
    attempt: int = 1


class Action(Protocol):
    """An action type. Built-ins and plugins are the same: classes with these attributes.

    `destructive` (kill, cordon, scale, command) brings protection checks and fleet-share holds;
    `unit` is what its fleet share counts (`node` for an action on the entity's node); a plugin that
    leaves them out is neither destructive nor node-wide. An action may also define `restores(params)`:
    true when, with these parameters, it undoes what a firing did (uncordon, scale back to `previous`), which
    `on_resolve` then runs whatever the limits (DESIGN §3.4). `escape` makes a value from the machine safe where it
    lands in the parameters (see actions/escaping.py); an action whose parameters land in different places (a URL,
    a JSON body, headers) defines `escape_at(path)` instead, given the parameter's path (`("url",)`)."""

    type: ClassVar[str]
    params: ClassVar[builtins.type[ActionParams]]
    entity_kinds: ClassVar[frozenset[EntityKind]]
    destructive: ClassVar[bool]
    unit: ClassVar[ActionUnit]
    escape: ClassVar[Callable[[str], str]]

    async def run(self, ctx: ActionContext) -> ActionResult: ...


def run_timeout(action: object, params: ActionParams, default: float) -> float:
    """The time limit of one run: the action's `run_timeout(params, default)` if it has one
    (kill waits out its grace), else a `timeout` parameter, else config `actions.timeout`."""
    custom = getattr(action, "run_timeout", None)
    if callable(custom):
        return float(custom(params, default))
    own = getattr(params, "timeout", None)
    return float(own) if isinstance(own, int | float) and own > 0 else default
