"""GPM through the NVML sampler: SM, tensor and DRAM activity between samples, per GPU and per MIG instance."""

from __future__ import annotations

from datetime import UTC, datetime

import pynvml

from agent.gpm import GPM_METRICS
from agent.nvml import NvmlSampler
from tests.agent.fake_pynvml import NVML_ERROR_NOT_SUPPORTED, FakeDevice, FakeNvml
from tests.agent.test_nvml import NoPsutil

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
HOPPER = {1: 91.0, 2: 63.5, 5: 41.25, 10: 30.0, 20: 2.0, 21: 0.5}  # GPM metric id -> value


def sampler(devices: list[FakeDevice]) -> tuple[NvmlSampler, FakeNvml]:
    nv = FakeNvml(devices)
    return NvmlSampler(nv, identifier=NoPsutil()), nv


def test_gpm_metric_ids_are_pynvml_s() -> None:
    for const, metric_id, _ in GPM_METRICS.values():
        assert getattr(pynvml, const) == metric_id, const
    for fn in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmMigSampleGet",
               "nvmlGpmMetricsGet", "nvmlGpmSampleFree"):
        assert hasattr(pynvml, fn) and hasattr(FakeNvml([]), fn), fn
    assert pynvml.NVML_GPM_METRICS_GET_VERSION == FakeNvml([]).NVML_GPM_METRICS_GET_VERSION
    fields = {f for f, _ in pynvml.c_nvmlGpmMetricsGet_t._fields_}
    assert {"version", "numMetrics", "sample1", "sample2", "metrics"} <= fields


def test_the_first_sample_has_no_activity_the_second_has_it() -> None:
    s, _ = sampler([FakeDevice(util=91, gpm=dict(HOPPER))])
    first = s.sample(NOW).gpus[0]
    assert first.sm_active_pct is None and first.tensor_active_pct is None  # nothing to compare with yet
    g = s.sample(NOW).gpus[0]
    assert (g.gr_engine_active_pct, g.sm_active_pct, g.tensor_active_pct, g.dram_active_pct) == (
        91.0, 63.5, 41.25, 30.0)
    assert g.pcie_tx_bytes_s == 2.0 * 1024 * 1024 and g.pcie_rx_bytes_s == 0.5 * 1024 * 1024


def test_activity_is_measured_between_the_last_two_samples() -> None:
    dev = FakeDevice(gpm=dict(HOPPER))
    s, nv = sampler([dev])
    s.sample(NOW)
    s.sample(NOW)
    dev.gpm = {**HOPPER, 2: 3.0}
    assert s.sample(NOW).gpus[0].sm_active_pct == 3.0
    assert nv.calls["nvmlGpmSampleGet"] == 3 and nv.calls["nvmlGpmSampleAlloc"] == 2  # two samples, reused


def test_a_metric_the_gpu_lacks_is_null_not_zero() -> None:
    s, _ = sampler([FakeDevice(gpm={2: 50.0})])
    s.sample(NOW)
    g = s.sample(NOW).gpus[0]
    assert g.sm_active_pct == 50.0 and g.tensor_active_pct is None and g.dram_active_pct is None


def test_a_gpu_without_gpm_is_never_sampled() -> None:
    s, nv = sampler([FakeDevice(util=40)])  # an A100: no GPM
    for _ in range(3):
        g = s.sample(NOW).gpus[0]
    assert g.sm_active_pct is None and g.util_pct == 40.0
    assert nv.calls["nvmlGpmSampleAlloc"] == 0 and nv.calls["nvmlGpmSampleGet"] == 0


def test_a_failed_sample_starts_over_instead_of_spanning_the_gap() -> None:
    dev = FakeDevice(gpm=dict(HOPPER))
    s, _ = sampler([dev])
    s.sample(NOW)
    dev.fail["nvmlGpmSampleGet"] = 999  # NVML_ERROR_UNKNOWN: logged once, read as null
    assert s.sample(NOW).gpus[0].sm_active_pct is None
    del dev.fail["nvmlGpmSampleGet"]
    assert s.sample(NOW).gpus[0].sm_active_pct is None  # one good sample again: nothing to compare yet
    assert s.sample(NOW).gpus[0].sm_active_pct == 63.5


def test_mig_instances_get_activity_and_a_utilization_from_gpm() -> None:
    no_util = {"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED}
    mig = [FakeDevice(uuid="MIG-a", name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gi_id=1, fail=dict(no_util),
                      gpm={1: 80.0, 2: 55.0, 5: 20.0}),
           FakeDevice(uuid="MIG-b", name="NVIDIA H100 80GB HBM3 MIG 1g.10gb", gi_id=9, fail=dict(no_util),
                      gpm={1: 0.0, 2: 0.0, 5: 0.0})]
    parent = FakeDevice(uuid="GPU-p", mig=mig, fail=dict(no_util), gpm={1: 34.0, 2: 24.0, 5: 9.0})
    s, nv = sampler([parent])
    s.sample(NOW)
    p, a, b = s.sample(NOW).gpus
    assert (a.mig_parent, a.mig_gi_id, a.mig_profile, a.util_pct, a.sm_active_pct) == (
        "GPU-p", 1, "3g.40gb", 80.0, 55.0)
    assert (b.mig_gi_id, b.mig_profile, b.util_pct, b.tensor_active_pct) == (9, "1g.10gb", 0.0, 0.0)
    # the parent has whole-GPU activity but no utilization: its instances are counted, not it
    assert p.util_pct is None and p.sm_active_pct == 24.0
    assert nv.calls["nvmlGpmMigSampleGet"] == 4


def test_close_frees_every_gpm_sample() -> None:
    mig = [FakeDevice(uuid="MIG-a", gi_id=1, gpm={1: 1.0})]
    s, nv = sampler([FakeDevice(gpm=dict(HOPPER)), FakeDevice(uuid="GPU-p", mig=mig, gpm={1: 1.0})])
    s.sample(NOW)
    s.close()
    assert len(nv.gpm_samples) == 6 and all(x.freed for x in nv.gpm_samples)
