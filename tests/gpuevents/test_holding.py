"""The one definition of held idle, case by case."""

from __future__ import annotations

from gpuevents.events import GpuInfo
from gpuevents.holding import count_held_idle, held, held_idle, parted_uuids


def gpu(index: int = 0, **kw: object) -> GpuInfo:
    return GpuInfo.model_validate({"node": "n", "index": index, "idle": True, **kw})


def test_a_process_an_owner_or_an_allocation_holds_a_gpu() -> None:
    assert [held(g) for g in (gpu(pids=[1]), gpu(owners=["bob"]), gpu(allocated=True), gpu(allocated=False),
                              gpu())] == [True, True, True, False, False]


def test_held_idle_leaves_out_busy_lost_parted_and_offline() -> None:
    assert held_idle(gpu(allocated=True))
    assert not held_idle(gpu(allocated=True, idle=False))
    assert not held_idle(gpu(allocated=True, lost=True))
    assert not held_idle(gpu(allocated=True), parted=True)
    assert not held_idle(gpu(allocated=True), online=False)


def test_a_node_counts_a_mig_parent_through_its_instances() -> None:
    gpus = [gpu(0, uuid="P", pids=[5]), gpu(1, uuid="I", mig_parent="P", pids=[5]), gpu(2, uuid="W", pids=[6])]
    assert parted_uuids(gpus) == {"P"}
    assert count_held_idle(gpus) == 2
    assert count_held_idle(gpus, online=False) == 0
