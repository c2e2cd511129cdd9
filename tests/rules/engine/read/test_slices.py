"""Working a slice at a time: the sliced sort equals sorted(), freeing empties the list, packed JSON gives back
every document as it went in."""

from __future__ import annotations

import gc
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rules.engine.read import slices
from rules.engine.read.slices import Packed, Slicer, add, release, sorted_sliced
from tests.waiting import wait_for


class CountingSlicer(Slicer):
    """A slicer whose every check is due: counts the pauses."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.pauses = 0

    async def pause(self) -> None:
        self.pauses += 1
        await super().pause()


async def test_the_sliced_sort_is_sorted_and_stable_and_pauses() -> None:
    rng = random.Random(3)
    items = [(rng.randrange(50), i) for i in range(5 * slices.SORT_RUN + 17)]
    chunks: list[list[tuple[int, int]]] = []
    for x in items:
        add(chunks, x)
    assert [len(c) for c in chunks] == [slices.SORT_RUN] * 5 + [17]
    slicer = CountingSlicer()
    got = [x async for x in sorted_sliced(chunks, lambda x: x[0], slicer)]
    assert got == sorted(items, key=lambda x: x[0])  # stable: equal keys keep their order
    assert slicer.pauses > 5 and chunks == []  # read, and freed


async def test_release_empties_the_list_a_step_at_a_time() -> None:
    items = list(range(3 * slices.FREE_STEP + 1))
    slicer = CountingSlicer()
    await release(items, slicer)
    assert items == [] and slicer.pauses == 4


@given(st.lists(st.binary(max_size=40), max_size=3 * slices.PACK + 5))
def test_packed_json_gives_back_every_document(docs: list[bytes]) -> None:
    packed = Packed()
    for d in docs:
        packed.append(d)
    packed.done()
    assert len(packed) == len(docs) and list(packed) == docs
    assert packed[1:4] == docs[1:4] and packed.range(len(docs) - 2) == docs[-2:]
    assert packed[len(docs) - 1:len(docs) + 10] == docs[-1:]


async def test_a_freezing_slicer_leaves_no_young_objects_for_the_next_collection() -> None:
    made = [[i] for i in range(5_000)]  # young objects, as a consumer's new views are
    frozen = gc.get_freeze_count()
    await Slicer(freeze=True).pause()
    assert gc.get_freeze_count() >= frozen + len(made) and gc.get_count()[0] < 100
    gc.unfreeze()  # give the test process its objects back


def packed_of(n: int) -> tuple[Packed, list[bytes]]:
    packed = Packed()
    for i in range(n):
        packed.append(b"%d" % i)
    return packed.done(), packed._blobs


async def test_a_packed_nobody_holds_is_freed_a_step_at_a_time_on_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slices, "FREE_BYTES", 1)  # one blob a step
    packed, blobs = packed_of(3 * slices.PACK)
    assert len(blobs) == 3
    del packed  # the last reader lets go
    assert len(blobs) == 3  # not freed at once
    await wait_for(lambda: not blobs, what="the blobs freed")


def test_a_packed_dropped_with_no_event_loop_is_freed_at_once() -> None:
    packed, blobs = packed_of(2 * slices.PACK)
    del packed
    assert blobs == []
