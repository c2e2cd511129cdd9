"""Decoding events from the stream, validating a snapshot's data once while its node repeats it."""

from __future__ import annotations

import orjson
from pydantic import ValidationError

from gpuevents.events import Event, NodeSnapshot, SnapshotEvent, decode_event


class RepeatDecoder:
    """`decode_event` that validates a snapshot's `data` once while a node repeats it byte for byte.

    An event's JSON is its envelope and, last, `"data":{...}`. When a node's snapshot carries the very bytes
    of `data` that the previous one did (already validated into a NodeSnapshot), only the envelope is parsed
    and validated, and the NodeSnapshot is reused; the event is the one `decode_event` would give. Anything
    else (another shape, another type, different bytes, any error on the way) takes `decode_event`, so a
    malformed event raises the same ValidationError."""

    MAX_NODES = 200_000

    def __init__(self) -> None:
        self._last: dict[str, tuple[bytes, NodeSnapshot]] = {}

    def decode(self, raw: bytes) -> Event:
        i = raw.find(b',"data":')
        if i > 0 and raw[-1:] == b"}":
            repeated = self._repeat(raw, i)
            if repeated is not None:
                return repeated
            segment = raw[i + 8:-1]
        else:
            segment = b""
        event = decode_event(raw)
        if segment and isinstance(event, SnapshotEvent):
            if len(self._last) >= self.MAX_NODES:
                self._last.clear()
            self._last[event.source] = (segment, event.data)
        return event

    def _repeat(self, raw: bytes, i: int) -> SnapshotEvent | None:
        try:
            envelope = orjson.loads(raw[:i] + b"}")
        except orjson.JSONDecodeError:
            return None
        if type(envelope) is not dict or envelope.get("type") != "node.snapshot":
            return None
        source = envelope.get("source")
        last = self._last.get(source) if type(source) is str else None
        if last is None or last[0] != raw[i + 8:-1]:
            return None
        envelope["data"] = last[1]
        try:
            return SnapshotEvent.model_validate(envelope)
        except ValidationError:
            return None  # let decode_event say what is wrong
