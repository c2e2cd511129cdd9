"""The replies every engine server shares: a malformed request's error, and what an asker says when no engine
answered; `gpuevents free`'s envelope."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gpuevents.wire.free import FreeAnswer


class ErrorReply(BaseModel):
    """An engine could not take a request: `error` says which field and why."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    ok: Literal[False] = False
    error: str


def bad_request(what: str, e: ValidationError) -> bytes:
    """The reply to a request that did not validate: each wrong field by name, on one line."""
    parts = []
    for err in e.errors(include_url=False):
        where = ".".join(str(p) for p in err.get("loc", ())) or "the request"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return ErrorReply(error=f"malformed {what} request: " + "; ".join(parts)).model_dump_json().encode()


class NoEngine(Exception):
    """No engine answered a request: nothing was stored or done (the engine is the only one that applies the
    rule's bounds and approvals), and the asker is told to ask again once one runs."""

    def __init__(self, what: str, cause: str) -> None:
        super().__init__(f"no engine answered ({cause}): {what}. Nothing was stored; start `gpuevents engine` "
                         "(or wait for one to take over) and ask again")


class FreeReply(BaseModel):
    """One engine's answer to `gpuevents free`: its part of the fleet (`partition` of `partitions`)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    ok: Literal[True] = True
    partition: int | None = None
    partitions: int = 1
    answer: FreeAnswer
