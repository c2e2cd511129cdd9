"""Large work on the event loop a few milliseconds at a time: a slicer, a sliced sort, sliced freeing, and JSON
documents packed into few objects (so that neither the garbage collector nor freeing them walks many)."""

from __future__ import annotations

import asyncio
import gc
import heapq
import time
import weakref
from array import array
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar, overload

from gpuevents.aio import guarded_task

SLICE_S = 0.004  # how long one slice may hold the event loop
SORT_RUN = 2_000  # items sorted at once (a run of the sliced merge sort)
FREE_STEP = 2_048  # items freed at once
PACK = 1_024  # JSON documents in one blob

T = TypeVar("T")


class Slicer:
    """Yields the event loop once a slice's time is used up: `if s.due(): await s.pause()` in a loop.

    With `freeze`, each pause first freezes what is alive (`gc.freeze`, which costs nothing): a collection that
    starts next, in the consumer or in the next slice, walks only what was made since, never the seconds'
    worth of young objects (mostly the consumer's new views) that made one take 10-25 ms. It is what the
    engine's GC policy does every second (rules/engine/gcpolicy.py), done at every pause while a reader works.
    """

    def __init__(self, budget_s: float = SLICE_S, freeze: bool = False) -> None:
        self.budget_s = budget_s
        self.freeze = freeze
        self.started = time.perf_counter()

    def due(self) -> bool:
        return time.perf_counter() - self.started >= self.budget_s

    async def pause(self) -> None:
        if self.freeze:
            gc.freeze()
        await asyncio.sleep(0)
        self.started = time.perf_counter()


async def release(items: list[Any], slicer: Slicer) -> None:
    """Empty `items` a step at a time: freeing a few hundred thousand objects at once takes tens of ms."""
    while items:
        del items[-FREE_STEP:]
        if slicer.due():
            await slicer.pause()


def add(chunks: list[list[T]], item: T) -> None:
    """Append `item` to a list kept as chunks of SORT_RUN: the garbage collector's young collections walk the
    chunk being filled, never one list of a few hundred thousand items."""
    if not chunks or len(chunks[-1]) >= SORT_RUN:
        chunks.append([])
    chunks[-1].append(item)


async def sorted_sliced(chunks: list[list[T]], key: Callable[[T], Any], slicer: Slicer) -> AsyncIterator[T]:
    """The items of `chunks` in the order of `key` (stable), a slice at a time: each chunk sorted apart, then
    merged as they are read. The chunks are emptied, a slice at a time, once read."""
    for chunk in chunks:
        chunk.sort(key=key)
        if slicer.due():
            await slicer.pause()
    for n, item in enumerate(heapq.merge(*chunks, key=key)):
        yield item
        if n % 256 == 0 and slicer.due():
            await slicer.pause()
    for chunk in chunks:
        await release(chunk, slicer)
    chunks.clear()


class Packed(Sequence[bytes]):
    """JSON documents (bytes) packed PACK to a blob with their end offsets: an item is a slice of its blob.

    When the last reader lets go of it, its blobs are freed a few at a time on the event loop: giving 200 MB
    back to the system at once takes ~20 ms."""

    def __init__(self) -> None:
        self._blobs: list[bytes] = []
        weakref.finalize(self, _bury, self._blobs)  # the finalizer holds the blobs, so they outlive the Packed
        self._ends: list[array[int]] = []
        self._pending: list[bytes] = []
        self._len = 0

    def append(self, raw: bytes) -> None:
        self._pending.append(raw)
        self._len += 1
        if len(self._pending) == PACK:
            self._pack()

    def done(self) -> Packed:
        if self._pending:
            self._pack()
        return self

    def _pack(self) -> None:
        ends, at = array("Q"), 0
        for raw in self._pending:
            at += len(raw)
            ends.append(at)
        self._blobs.append(b"".join(self._pending))
        self._ends.append(ends)
        self._pending = []

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> bytes: ...

    @overload
    def __getitem__(self, i: slice) -> list[bytes]: ...

    def __getitem__(self, i: int | slice) -> bytes | list[bytes]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not 0 <= i < self._len - len(self._pending):
            raise IndexError(i)
        blob, k = divmod(i, PACK)
        ends = self._ends[blob]
        return self._blobs[blob][ends[k - 1] if k else 0:ends[k]]

    def __iter__(self) -> Iterator[bytes]:
        for i in range(self._len - len(self._pending)):
            yield self[i]

    def range(self, start: int, stop: int | None = None) -> list[bytes]:
        return self[start:stop]


_graves: list[list[bytes]] = []
_reaper: list[asyncio.Task[None]] = []
FREE_BYTES = 4 << 20  # bytes given back between two yields


def _bury(blobs: list[bytes]) -> None:
    """A Packed is gone: free its blobs a step at a time if an event loop runs here, else now."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        blobs.clear()
        return
    _graves.append(blobs)
    if not _reaper or _reaper[0].done() or _reaper[0].get_loop() is not loop:
        _reaper[:] = [guarded_task(_reap(), "free read models")]


async def _reap() -> None:
    while _graves:
        blobs, freed = _graves[-1], 0
        while blobs and freed < FREE_BYTES:
            freed += len(blobs.pop())
        if not blobs:
            _graves.pop()
        await asyncio.sleep(0)
