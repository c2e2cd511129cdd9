"""The key-value store the runner keeps its state in: the bus's KV bucket, or an in-memory stand-in."""

from __future__ import annotations

import hashlib
from typing import Protocol

from gpuevents.bus import KvEntry, KvExists, KvWrongRevision
from gpuevents.subjects import kv_token


class KeyValue(Protocol):
    """What the runner needs of a KV bucket (`gpuevents.bus.Kv` has it): CAS create and update."""

    async def get(self, key: str) -> KvEntry | None: ...
    async def put(self, key: str, value: bytes) -> int: ...
    async def create(self, key: str, value: bytes) -> int: ...
    async def update(self, key: str, value: bytes, last: int) -> int: ...
    async def delete(self, key: str) -> None: ...
    async def keys(self, prefix: str = "") -> list[str]: ...


class MemoryKv:
    """The same compare-and-set semantics in memory: for runs without a bus (`rules test`, dry runs)."""

    def __init__(self) -> None:
        self._data: dict[str, KvEntry] = {}
        self._revision = 0

    async def get(self, key: str) -> KvEntry | None:
        return self._data.get(key)

    def _set(self, key: str, value: bytes) -> int:
        self._revision += 1
        self._data[key] = KvEntry(key, value, self._revision)
        return self._revision

    async def put(self, key: str, value: bytes) -> int:
        return self._set(key, value)

    async def create(self, key: str, value: bytes) -> int:
        if key in self._data:
            raise KvExists(key)
        return self._set(key, value)

    async def update(self, key: str, value: bytes, last: int) -> int:
        current = self._data.get(key)
        if current is None or current.revision != last:
            raise KvWrongRevision(key)
        return self._set(key, value)

    async def delete(self, key: str) -> None:
        self._data.pop(key, None)

    async def keys(self, prefix: str = "") -> list[str]:
        return [k for k in self._data if k.startswith(prefix)]


def kv_key(*parts: str) -> str:
    """A KV key for `parts`: each but the last as a readable token (escaped as every KV key is, cut to 40
    characters), then a digest of them all, so distinct inputs never collide and free text stays short."""
    digest = hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]
    readable = ".".join(kv_token(p)[:40] for p in parts[:-1])
    return f"{readable}.{digest}" if readable else digest
