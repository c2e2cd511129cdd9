"""Decoding events from the stream: msgspec's Structs first, pydantic for what they leave; a snapshot's data
decoded once while its node repeats it."""

from __future__ import annotations

from gpuevents.agentdata import NodeSnapshot
from gpuevents.events import Event, SnapshotEvent, decode_event
from gpuevents.wire import messages


def decode(raw: bytes) -> Event:
    """The event `raw` holds, every time in it in UTC: decoded with the Structs of gpuevents/wire/messages.py,
    else (a value of another JSON type than its field's, the engine's own scheduler events) validated by pydantic,
    which accepts what it always accepted and raises its ValidationError on the rest."""
    event = messages.decode(raw)
    return event if event is not None else messages.utc_event(decode_event(raw))


class RepeatDecoder:
    """`decode` that decodes a snapshot's `data` once while a node repeats it byte for byte.

    An event's JSON is its envelope and, last, `"data":{...}`. When a node's snapshot carries the very bytes
    of `data` that the previous one did (already decoded into a NodeSnapshot), only the envelope is decoded,
    and the NodeSnapshot is reused; the event is the one `decode` would give. Anything else (another shape,
    another type, different bytes, any error on the way) takes `decode`, so a malformed event raises the same
    ValidationError.

    A decoded snapshot is kept for its node only once the caller believes it (`accepted`): an event the caller
    rejects (its subject names another node, say) never takes a place, so a publisher that makes up sources
    cannot grow the cache; it holds at most one snapshot per node whose events were accepted."""

    MAX_NODES = 200_000

    def __init__(self) -> None:
        self._last: dict[str, tuple[bytes, NodeSnapshot]] = {}
        self._candidate: tuple[SnapshotEvent, bytes] | None = None  # the last snapshot decoded, not yet accepted

    def __len__(self) -> int:
        """How many nodes' snapshots are kept."""
        return len(self._last)

    def decode(self, raw: bytes) -> Event:
        self._candidate = None
        i = raw.find(b',"data":')
        if i > 0 and raw[-1:] == b"}":
            repeated = self._repeat(raw, i)
            if repeated is not None:
                return repeated
            segment = raw[i + 8:-1]
        else:
            segment = b""
        event = decode(raw)
        if segment and isinstance(event, SnapshotEvent):
            self._candidate = (event, segment)
        return event

    def accepted(self, event: Event) -> None:
        """The caller believes `event` (the last one decoded): keep its snapshot data for its node's repeats."""
        cand = self._candidate
        self._candidate = None
        if cand is None or cand[0] is not event:
            return
        if event.source not in self._last and len(self._last) >= self.MAX_NODES:
            self._last.clear()
        self._last[event.source] = (cand[1], cand[0].data)

    def _repeat(self, raw: bytes, i: int) -> SnapshotEvent | None:
        env = messages.envelope(raw[:i] + b',"data":null}')  # the envelope alone: no need to scan the data
        if env is None or env.type != "node.snapshot":
            return None
        last = self._last.get(env.source)
        if last is None or last[0] != raw[i + 8:-1]:
            return None
        return messages.with_data(env, SnapshotEvent, last[1])
