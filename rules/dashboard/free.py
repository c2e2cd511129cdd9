"""Which GPUs to start a job on now: the one answer behind `gpuevents free` and `GET /api/free`. Pure."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from gpuevents.wire.fleet import FleetGpu, FleetNode
from gpuevents.wire.free import REASONS, FreeAnswer, FreeGpu, FreeNode, FreeQuery, idleness, merge_answers, ranked
from rules.dashboard.fleet_view import FleetRows, FleetView


def _reason(node: FleetNode, gpu: FleetGpu, q: FreeQuery) -> str | None:
    """Why this GPU is not offered, or None. Safety first: anything a job or a person holds is never free."""
    if not node.online:
        return "offline"
    if node.cordoned:
        return "cordoned"
    if gpu.lost:
        return "lost"
    if gpu.allocated:
        return "allocated"
    if gpu.processes or gpu.owner or gpu.held_idle:
        return "held"
    if not gpu.idle:
        return "busy"  # in use by something the agent cannot attribute: not free either
    if q.model and q.model.lower() not in (gpu.model or "").lower():
        return "filtered"
    if q.min_free_mem_mib is not None:
        free = _mem_free(gpu)
        if free is None or free < q.min_free_mem_mib:
            return "filtered"
    return None


def _node_matches(node: FleetNode, q: FreeQuery) -> bool:
    if q.cluster is not None and node.cluster != q.cluster:
        return False
    for key, value in q.labels.items():
        if key not in node.labels or (value is not None and node.labels[key] != value):
            return False
    return True


def _mem_free(gpu: FleetGpu) -> float | None:
    if gpu.mem_total_mib is None:
        return None
    return max(0.0, gpu.mem_total_mib - (gpu.mem_used_mib or 0.0))


def free_gpus(fleet: FleetView, query: FreeQuery) -> FreeAnswer:
    """The GPUs to start a job on now, from the engine's latest view of the fleet.

    Never offered: a GPU on an offline or cordoned node, a lost GPU, one a scheduler allocated, one held by a
    process or an owner, one in use. Nodes come best first (the most idle GPU first; with `count`, only nodes
    with that many free GPUs, each offering exactly that many, the node whose chosen GPUs have all been idle
    the longest first).
    """
    excluded = dict.fromkeys(REASONS, 0)
    candidates: list[tuple[FleetNode, list[FreeGpu]]] = []
    total = 0
    for node in fleet.nodes:
        if not _node_matches(node, query):
            excluded["filtered"] += len(node.gpus)
            continue
        offered = []
        for gpu in node.gpus:
            reason = _reason(node, gpu, query)
            if reason is not None:
                excluded[reason] += 1
                continue
            offered.append(FreeGpu(
                cluster=node.cluster, node=node.name, index=gpu.index, uuid=gpu.uuid,
                device=gpu.uuid if gpu.mig_parent and gpu.uuid else str(gpu.index), model=gpu.model,
                util_pct=gpu.util_pct, idle_for_s=gpu.idle_for_s, mem_free_mib=_mem_free(gpu),
                mem_total_mib=gpu.mem_total_mib,
            ))
        total += len(offered)
        if offered:
            offered.sort(key=idleness)
            candidates.append((node, offered))
    nodes = []
    for node, offered in candidates:
        if query.count is not None:
            if len(offered) < query.count:
                continue
            offered = offered[:query.count]
        devices = ",".join(g.device for g in offered)
        nodes.append(FreeNode(cluster=node.cluster, node=node.name, labels=node.labels, gpus=offered,
                              cuda_visible_devices=devices,
                              env=f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={devices}"))
    return ranked(fleet.time, query, nodes, total, excluded)


async def free_gpus_sliced(fleet: FleetView | FleetRows, query: FreeQuery, chunk: int = 128) -> FreeAnswer:
    """`free_gpus` a chunk of nodes at a time, letting the event loop run in between (a large fleet's answer
    would otherwise hold it for a good part of a second); the same answer."""
    total = len(fleet.nodes) if isinstance(fleet, FleetView) else len(fleet.node_json)
    answers = []
    for start in range(0, total, chunk):
        nodes: Sequence[FleetNode] = (fleet.nodes[start:start + chunk] if isinstance(fleet, FleetView)
                                      else list(fleet.nodes(start, start + chunk)))
        answers.append(free_gpus(FleetView.model_construct(time=fleet.time, nodes=list(nodes)), query))
        await asyncio.sleep(0)
    if not answers:
        return free_gpus(FleetView(time=fleet.time), query)
    return merge_answers(answers, query)


def bounded(answer: FreeAnswer, max_bytes: int) -> FreeAnswer:
    """The answer with as many of its best nodes as fit in `max_bytes` of JSON; the rest counted in
    `more_nodes`."""
    head = len(answer.model_copy(update={"nodes": []}).model_dump_json()) + 64
    kept = []
    for node in answer.nodes:
        size = len(node.model_dump_json()) + 1
        if head + size > max_bytes:
            break
        kept.append(node)
        head += size
    if len(kept) == len(answer.nodes):
        return answer
    return answer.model_copy(update={"nodes": kept, "more_nodes": answer.more_nodes + len(answer.nodes) - len(kept)})
