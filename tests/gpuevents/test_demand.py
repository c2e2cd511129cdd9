"""Demand from what the schedulers say: Slurm's GRES text and pending jobs, Kubernetes' pending pods."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuevents.demand import gres_gpus, kubernetes_pending, slurm_pending


def test_gres_text_in_slurms_spellings() -> None:
    assert gres_gpus("gres:gpu:2") == (2, None)
    assert gres_gpus("gres/gpu:a100:4") == (4, "a100")
    assert gres_gpus("gres:gpu") == (1, None)
    assert gres_gpus("gres:gpu:1,gres:shard:2") == (1, None)
    assert gres_gpus("N/A") == (0, None)


def test_pending_jobs_count_their_gpus_per_partition_type_and_cluster() -> None:
    text = ("12|gpu|2|2026-12-03T10:00:00|gres:gpu:4\n"          # 2 nodes x 4
            "13|gpu,bigmem|1|2026-12-03T09:30:00|gres/gpu:a100:1\n"  # either partition
            "14|cpu|1|2026-12-03T08:00:00|N/A\n")                  # no GPU: no demand
    entries, bad = slurm_pending(text)
    got = {(e.partition, e.model): (e.pending_gpus, e.waiting_since) for e in entries}
    t = datetime.fromisoformat("2026-12-03T09:30:00").astimezone(UTC)
    assert bad == 0
    assert got[("gpu", None)] == (9, t)
    assert got[("bigmem", None)] == (1, t)
    assert got[(None, "a100")] == (1, t)
    assert got[(None, None)] == (9, t)  # the whole cluster counts job 13 once
    assert ("cpu", None) not in got


def test_lines_that_are_not_squeues_are_counted_not_guessed() -> None:
    entries, bad = slurm_pending("garbage\n15|gpu|x|2026-12-03T10:00:00|gres:gpu:1\n")
    assert entries == [] and bad == 2


def pod(name: str, resources: dict[str, str], *, phase: str = "Pending", selector: dict[str, str] | None = None,
        created: str = "2026-12-03T10:00:00Z", node: str | None = None) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "team-a", "creationTimestamp": created},
            "spec": {"containers": [{"name": "c", "resources": {"limits": resources}}],
                     "nodeSelector": selector or {}, **({"nodeName": node} if node else {})},
            "status": {"phase": phase}}


def test_pending_pods_asking_for_gpus_or_mig_slices_are_demand_per_pool_and_model() -> None:
    pods = [
        pod("a", {"nvidia.com/gpu": "2"}, selector={"cloud.google.com/gke-nodepool": "h100-pool",
                                                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
        pod("b", {"nvidia.com/mig-1g.10gb": "1"}, created="2026-12-03T09:00:00Z"),
        pod("c", {"cpu": "2"}),                                      # no GPU
        pod("d", {"nvidia.com/gpu": "1"}, phase="Running"),          # allocated
        pod("e", {"nvidia.com/gpu": "1"}, node="gpu-7"),             # bound, pulling its image
    ]
    got = {(e.pool, e.model): (e.pending_gpus, e.waiting_since) for e in kubernetes_pending(pods)}
    assert got == {
        ("h100-pool", None): (2, datetime(2026, 12, 3, 10, tzinfo=UTC)),
        (None, "NVIDIA-H100-80GB-HBM3"): (2, datetime(2026, 12, 3, 10, tzinfo=UTC)),
        (None, "mig-1g.10gb"): (1, datetime(2026, 12, 3, 9, tzinfo=UTC)),
        (None, None): (3, datetime(2026, 12, 3, 9, tzinfo=UTC)),
    }
