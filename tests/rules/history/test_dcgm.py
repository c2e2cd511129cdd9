"""dcgm-exporter's series rebuilt into node snapshots: labels as the exporter writes them (MIG instances, pods,
labels Prometheus renamed), every state a GPU-hour can be in, NaN as no reading, and the aggregator counting the
snapshots into hours per state, owner and team as it counts live ones."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpuevents.agentdata import GpuInfo, NodeSnapshot
from gpuevents.config import ThresholdsConfig
from rules.history.dcgm import Classify, Rebuilder, gpu_of, grid, kube_label, pod_labels
from rules.history.promapi import Series
from rules.usage.rollup import TeamResolver, UsageAggregator

T = 1_800_000_000 // 3600 * 3600
BASE = {"gpu": "0", "UUID": "GPU-1", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "dgx-a", "instance": "x:9400"}
HOW = Classify(idle_rule=ThresholdsConfig().idle_rule, mem_floor_mib=256, owners={"nlp": "alice@example.org"})


def series(metric_values: dict[str, float], labels: dict[str, str], steps: int = 60) -> dict[str, list[Series]]:
    return {m: [Series(labels, [(T + 60 * i, v) for i in range(steps)])] for m, v in metric_values.items()}


def one_gpu(values: dict[str, float], labels: dict[str, str] = BASE) -> tuple[GpuInfo, NodeSnapshot]:
    events = list(Rebuilder("c0", HOW).events(grid(series(values, labels, steps=1))))
    return events[0].data.gpus[0], events[0].data


def test_a_mig_instance_is_named_by_its_gpu_and_instance_and_counted_by_its_profile() -> None:
    g = gpu_of(BASE | {"GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "2", "modelName": "NVIDIA A100-SXM4-80GB"})
    assert g is not None and g.index == 102 and g.model == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    info, _snap = one_gpu({"gr_active": 0.5, "fb_used": 100.0}, BASE | {"GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "2"})
    assert info.util_pct == 50.0 and info.mig_parent == "GPU-1" and not info.idle
    assert gpu_of({k: v for k, v in BASE.items() if k != "Hostname"}).node == "x"  # type: ignore[union-attr]
    assert gpu_of(BASE | {"gpu": ""}) is None


def test_each_state_a_gpu_hour_can_be_in() -> None:
    busy, _ = one_gpu({"util": 80.0, "fb_used": 30000.0})
    pod_idle, snap = one_gpu({"util": 0.0, "fb_used": 100.0}, BASE | {"pod": "nb-1", "namespace": "nlp"})
    mem_idle, _ = one_gpu({"util": 1.0, "fb_used": 9000.0})
    free, _ = one_gpu({"util": 0.0, "fb_used": 3.0})
    assert not busy.idle
    assert pod_idle.idle and pod_idle.allocated and pod_idle.job == "nlp/nb-1" and pod_idle.owner == "alice@example.org"
    assert snap.jobs[0].namespace == "nlp" and snap.jobs[0].scheduler == "kubernetes"
    assert mem_idle.idle and mem_idle.allocated and mem_idle.job is None
    assert free.idle and not free.allocated


def test_labels_prometheus_renamed_name_the_workloads_pod() -> None:
    info, _ = one_gpu({"util": 0.0, "fb_used": 0.0},
                      BASE | {"pod": "dcgm-exporter-x", "namespace": "gpu-operator", "exported_pod": "train-7",
                              "exported_namespace": "vision"})
    assert info.job == "vision/train-7"


def test_nan_is_no_reading() -> None:
    readings = grid({"util": [Series(BASE, [(T, float("nan")), (T + 60, 10.0)])]})
    assert sorted(readings) == [T + 60]


def test_the_aggregator_counts_rebuilt_snapshots_into_hours_per_state_owner_and_team() -> None:
    teams = {"alice@example.org": "nlp"}
    agg = UsageAggregator(snapshot_interval=60, gap_intervals=1, teams=TeamResolver(teams=teams))
    pod = BASE | {"pod": "nb-1", "namespace": "nlp"}
    found = series({"util": 0.0, "fb_used": 100.0, "power": 100.0}, pod)  # one hour held idle by a pod
    for e in Rebuilder("c0", HOW).events(grid(found)):
        agg.observe(e, e.time)
    agg.settle(datetime.fromtimestamp(T + 3600, UTC))
    ((key, amounts),) = agg.drain().usage
    assert (key.owner, key.team) == ("alice@example.org", "nlp")
    assert amounts.held_s == pytest.approx(3600) and amounts.busy_s == amounts.free_s == 0
    assert amounts.held_kwh == pytest.approx(0.1)


def test_idle_since_carries_across_chunks() -> None:
    rebuild = Rebuilder("c0", HOW)
    first = list(rebuild.events(grid(series({"util": 0.0, "fb_used": 0.0}, BASE, steps=2))))
    later = {"util": [Series(BASE, [(T + 600, 0.0)])], "fb_used": [Series(BASE, [(T + 600, 0.0)])]}
    (event,) = rebuild.events(grid(later))
    assert first[0].data.gpus[0].idle_since == datetime.fromtimestamp(T, UTC)
    assert event.data.gpus[0].idle_for_s == 600


def test_a_pods_owner_and_team_come_from_its_labels_else_its_namespace() -> None:
    how = Classify(idle_rule=ThresholdsConfig().idle_rule, owners={"nlp": "nlp-leads@example.org"},
                   owner_label=kube_label("example.org/owner"), team_label=kube_label("team"))
    how.pod_labels.update(pod_labels([{"namespace": "nlp", "pod": "train-1", "label_example_org_owner": "bob",
                                       "label_team": "language"}]))
    assert (how.owner_of("nlp", "train-1"), how.team_of("nlp", "train-1")) == ("bob", "language")
    assert (how.owner_of("nlp", "other"), how.team_of("nlp", "other")) == ("nlp-leads@example.org", "nlp")
    assert how.owner_of("", "bare") is None
