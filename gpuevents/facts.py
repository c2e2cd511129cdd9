"""What an action request says of its entity (`ActionRequest.facts`): the engine writes it, and every action,
message, protection check and kill target reads it, as does a custom action (a plugin's `ctx.request.facts`,
a `function` action's JSON).

The JSON keeps the shape the engine always sent: a part holds the keys it was given and no more (a gpu rule's
request has `gpu` and no `process`; a request read back from JSON keeps what it held, unknown keys included).
Plugins written against the older plain-dict form can still read `facts["processes"]` or `facts.get("gpu")`:
they get that part as JSON values."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

Stamp = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str, when_used="json")]
"""A time, written in JSON as `datetime.isoformat` writes it (`+00:00`), as the facts always were."""


class FactsPart(BaseModel):
    """A part of the facts: every field optional, unknown keys kept; serialised with the keys it was given.

    Defaults are plain values (pydantic copies a mutable one), never factories: the core builds these with
    `model_construct` for every action request, and a default factory costs pydantic a signature inspection
    each time it is used."""

    model_config = ConfigDict(extra="allow", frozen=True)

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        fields, given = type(self).model_fields, self.model_fields_set
        return {k: v for k, v in data.items() if k in given or k not in fields}

    @classmethod
    def build(cls, **values: Any) -> Self:
        """As `model_construct`, for the engine's hot path (a part of every action request): `values` are trusted,
        already of their fields' types; the fields not given take their defaults (a fresh list or dict)."""
        defaults = cls.__dict__.get("_defaults_cache")
        if defaults is None:
            defaults = tuple((n, f.default) for n, f in cls.model_fields.items())
            type.__setattr__(cls, "_defaults_cache", defaults)
        data = {n: (type(d)() if type(d) in (list, dict) else d) for n, d in defaults if n not in values}
        data.update(values)
        m = cls.__new__(cls)
        object.__setattr__(m, "__dict__", data)
        object.__setattr__(m, "__pydantic_fields_set__", set(values))
        object.__setattr__(m, "__pydantic_extra__", {})
        object.__setattr__(m, "__pydantic_private__", None)
        return m

    def get(self, key: str, default: Any = None) -> Any:
        """A key as JSON, as the plain-dict form of the facts gave it (for plugins written against it)."""
        return self.model_dump(mode="json").get(key, default)

    def __getitem__(self, key: str) -> Any:
        data = self.model_dump(mode="json")
        return data[key]

    def __contains__(self, key: object) -> bool:
        return key in self.model_dump(mode="json")


class NodeFacts(FactsPart):
    name: str | None = None
    cluster: str = "default"
    labels: dict[str, str] = {}
    online: bool | None = None


class ProcessFacts(FactsPart):
    """A process as `gpuevents.events.ProcessInfo` has it; `pid` and `create_time` name it for a kill."""

    pid: int | None = None
    create_time: Stamp | None = None
    name: str | None = None
    exe: str = ""
    user: str | None = None
    uid: int | None = None
    owner: str | None = None
    cmdline: str = ""
    pod: str | None = None
    pod_uid: str | None = None
    container_id: str | None = None
    gpus: list[int] = []
    age_s: float | None = None
    node: str | None = None
    job: str | None = None


class GpuFacts(FactsPart):
    index: int | None = None
    uuid: str | None = None
    model: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    idle: bool | None = None
    idle_since: Stamp | None = None
    idle_for_s: float | None = None
    owner: str | None = None
    node: str | None = None
    xid: int | None = None
    xid_at: Stamp | None = None
    allocated: bool | None = None
    job: str | None = None


class JobFacts(FactsPart):
    id: str | None = None
    scheduler: str | None = None
    name: str | None = None
    user: str | None = None
    owner: str | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    namespace: str | None = None
    controller: str | None = None
    nodes: list[str] | None = None
    gpu_count: int | None = None
    pods: list[str] | None = None  # Kubernetes; None for an ended job
    controller_uid: str | None = None
    controller_generation: int | None = None
    annotations: dict[str, str] | None = None


class NextFacts(FactsPart):
    """The incident's next staged action: its type, when, in how long (`in`), and in words (`says`)."""

    type: str
    at: Stamp
    in_: str | None = Field(None, alias="in")
    says: str = ""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True, serialize_by_alias=True)


class IncidentFacts(FactsPart):
    id: str | None = None
    started_at: Stamp | None = None
    firing_since: Stamp | None = None
    firing_for: str | None = None
    active_for: str | None = None
    count: int | None = None
    next: NextFacts | None = None
    resolve_reason: str | None = None
    resolved_by: str | None = None
    kept_until: Stamp | None = None


class CostFacts(FactsPart):
    """Estimated waste so far; `text` (e.g. `$12.40`) wins over `amount` + `currency`."""

    amount: float | None = None
    currency: str = "USD"
    text: str | None = None
    per_hour: float | None = None

    def display(self) -> str | None:
        if self.text:
            return self.text
        if self.amount is None:
            return None
        return f"{self.amount:,.2f} {self.currency}"


class Facts(FactsPart):
    """The entity of an action request: its `node`; a gpu rule's `gpu`, a process rule's `process`, a job's
    `job`; every process of the entity (`processes`, what a kill ends); its GPUs (`gpus`, for other kinds);
    `owners`; the `incident`; the `cost` so far; for an operator's request, `requested_by`."""

    node: NodeFacts = NodeFacts()
    gpu: GpuFacts | None = None
    process: ProcessFacts | None = None
    processes: list[ProcessFacts] = []
    gpus: list[GpuFacts] = []
    owners: list[str] = []
    job: JobFacts | None = None
    incident: IncidentFacts | None = None
    cost: CostFacts | None = None
    requested_by: str | None = None

    @field_validator("node", mode="before")
    @classmethod
    def _no_node(cls, v: Any) -> Any:
        return {} if v is None else v

    @field_validator("cost", mode="before")
    @classmethod
    def _cost_number(cls, v: Any) -> Any:
        """A bare amount or text, as a hand-written request may give it."""
        if isinstance(v, int | float):
            return {"amount": v}
        if isinstance(v, str):
            return {"text": v}
        return v
