"""An example gpuevents action plugin: `example.jsonl` appends one JSON line per incident to a file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from actions.protocol import Action, ActionContext, ActionParams, ActionResult, PermanentError


class JsonLinesParams(ActionParams):
    """Parameters are a pydantic model; `type` is the discriminator and must be a Literal."""

    type: Literal["example.jsonl"] = "example.jsonl"
    path: str = Field(min_length=1, description="the file to append to (created if absent)")
    note: str = ""


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(line + "\n")


class JsonLinesAction(Action[JsonLinesParams]):
    """Registered through the entry point; the runner creates one instance and calls `run` per request.

    What is left out takes the base's defaults: every entity kind, not destructive, counted in entities, values
    from the machine as they are (they go into JSON, which escapes itself)."""

    type: ClassVar[str] = "example.jsonl"
    params = JsonLinesParams

    async def run(self, params: JsonLinesParams, ctx: ActionContext) -> ActionResult:
        req = ctx.request
        record: dict[str, Any] = {
            "key": req.key, "rule": req.rule, "entity_id": req.entity_id, "incident_id": req.incident_id,
            "phase": req.phase, "note": params.note, "facts": req.facts.model_dump(mode="json"),
        }
        try:
            # File I/O off the event loop: an action must never block the runner.
            await asyncio.to_thread(_append, Path(params.path), json.dumps(record, default=str))
        except OSError as e:
            raise PermanentError(f"cannot append to {params.path}: {e.strerror}") from None
        return ActionResult(detail=f"appended to {params.path}")
