"""The action base: what every action (built-in or plugin) declares, its parameters, context and outcomes."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict

# Re-exported for plugins: `from actions.protocol import no_escape, PermanentError`.
from actions.errors import Deferred as Deferred
from actions.errors import PermanentError as PermanentError
from actions.errors import TransientError as TransientError
from actions.escaping import UnsafeValue as UnsafeValue
from actions.escaping import no_escape as no_escape
from gpuevents.records import ActionRequest
from gpuevents.records import ActionUnit as ActionUnit
from gpuevents.records import EntityKind as EntityKind

if TYPE_CHECKING:
    from actions.services import Services
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


class ActionContext:
    """Everything an action may use while it runs: the request, its validated parameters (also handed to `run`),
    the config, the services the runner shares (`ctx.services.bus`, `.kv`, `.clock`, `.http()`, `.kube()`,
    `.report`) and the attempt. Outside a runner (a plugin's own test) it makes a private set of services."""

    __slots__ = ("attempt", "config", "params", "request", "services")

    def __init__(self, request: ActionRequest, params: ActionParams, config: Config,
                 services: Services | None = None, attempt: int = 1) -> None:
        if services is None:
            from actions.services import Services

            services = Services(config)
        self.request = request
        self.params = params
        self.config = config
        self.services: Services = services
        self.attempt = attempt


P = TypeVar("P", bound=ActionParams)


class Action(Generic[P]):
    """The base of every action type, built-in or plugin: `class Mine(Action[MyParams])`.

    A class declares what the rules engine and `rules check` need without running anything: `type`, `params`
    (the model), the entity kinds it acts on, whether it is `destructive` (protection checks, fleet-share holds,
    approvals) and its `unit` (what its fleet share counts: `node` for an action on the entity's node). The
    defaults are the harmless ones: every kind, not destructive, counted in entities, values from the machine
    landing unescaped (`escape`). Hooks are methods to override: `escape_at(path)` where parameters land in
    different places (a URL, a JSON body, headers; see actions/escaping.py), `restores(params)` when with these
    parameters it undoes what a firing did (DESIGN §3.4: `on_resolve` runs it whatever the limits),
    `readable(params)`, `run_timeout(params, default)`.

    `runtime` splits a heavy action in two: this class (the spec) stays light, and `runtime` names
    (`"package.module:Class"`) a subclass that implements `run`, imported only when the action first runs, so
    `rules check` never loads an HTTP client or a Kubernetes library. Without `runtime`, the class runs itself."""

    type: ClassVar[str]
    params: ClassVar[builtins.type[ActionParams]]
    entity_kinds: ClassVar[frozenset[EntityKind]] = ALL_KINDS
    destructive: ClassVar[bool] = False
    unit: ClassVar[ActionUnit] = "entity"
    runtime: ClassVar[str | None] = None
    engine_only: ClassVar[str] = ""
    """Not for rules to write, and why (the engine makes such requests itself: `keep`); `rules check` says so."""

    @staticmethod
    def escape(value: str) -> str:
        """A value from the machine as it lands in a parameter: as it is, unless the action says otherwise."""
        return no_escape(value)

    @classmethod
    def escape_at(cls, path: tuple[str | int, ...]) -> Callable[[str], str]:
        """The escape for the parameter at `path` (`("url",)`, `("body", "text")`): `escape` unless overridden."""
        return cls.escape

    @classmethod
    def restores(cls, params: Mapping[str, Any]) -> bool:
        """Whether, with these rendered parameters, it undoes what a firing did (uncordon; scale back)."""
        return False

    @classmethod
    def readable(cls, params: Mapping[str, Any]) -> dict[str, Any]:
        """Parameters as people read them (rule tests, replays, the audit)."""
        return dict(params)

    def run_timeout(self, params: P, default: float) -> float:
        """The time limit of one run: a positive `timeout` parameter, else config `actions.timeout` (`default`).
        Kill overrides it to wait out its grace."""
        own = getattr(params, "timeout", None)  # a field of many actions, not of all
        return float(own) if isinstance(own, int | float) and own > 0 else default

    async def run(self, params: P, ctx: ActionContext) -> ActionResult:
        """Do it once: `ok`, or `failed`/`refused` with the reason; raise TransientError to be retried."""
        where = f" (its runtime {self.runtime} did not override run)" if self.runtime else ""
        raise NotImplementedError(f"action {self.type} has no run{where}")
