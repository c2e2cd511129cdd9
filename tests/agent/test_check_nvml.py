"""scripts/check_nvml.py against the stand-in pynvml: prints fields and latencies; non-zero on failure."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import time
from pathlib import Path
from types import ModuleType

from tests.agent.fake_pynvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    FakeDevice,
    FakeNvml,
)

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_nvml.py"


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_nvml", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check(nv: FakeNvml) -> tuple[int, str]:
    out = io.StringIO()
    rc = script().run_check(nv, seconds=0.0, interval=0.0, out=out)
    return rc, out.getvalue()


def test_clean_run_prints_every_field_and_latency() -> None:
    dev = FakeDevice(uuid="GPU-x", util=55, compute=[(os.getpid(), 1234)],
                     proc_util=[(os.getpid(), int(time.time() * 1e6), 55)],
                     fail={"nvmlDeviceGetFanSpeed": NVML_ERROR_NOT_SUPPORTED})
    rc, text = check(FakeNvml([dev]))
    assert rc == 0, text
    for field in ("uuid=GPU-x", "util_pct=55.0", "mem_total_mib=81559.0", "temp_c=35.0", "power_w=70.0",
                  "power_limit_w=700.0", "fan_pct=null", "ecc_uncorrected=0", "mig_parent=null"):
        assert field in text
    assert f"pid {os.getpid()} on gpu 0: mem_mib=1234.0 sm_util_pct=55.0" in text
    assert "nvmlDeviceGetUtilizationRates" in text and "sample() whole" in text
    assert "not supported (reported as null, not a failure): gpu 0: nvmlDeviceGetFanSpeed" in text
    assert "XID events: registered" in text and text.rstrip().endswith("no failures")


def test_an_nvml_error_fails_the_check() -> None:
    rc, text = check(FakeNvml([FakeDevice(fail={"nvmlDeviceGetPowerUsage": NVML_ERROR_NO_PERMISSION})]))
    assert rc == 1 and "FAIL" in text and "nvmlDeviceGetPowerUsage" in text


def test_a_lost_gpu_fails_the_check() -> None:
    rc, text = check(FakeNvml([FakeDevice(fail={"nvmlDeviceGetMemoryInfo": NVML_ERROR_GPU_IS_LOST})]))
    assert rc == 1 and "is lost" in text


def test_no_nvml_exits_2() -> None:
    rc, text = check(FakeNvml([], init_error=12))
    assert rc == 2 and "NVML did not initialise" in text


def test_gpm_and_mig_devices_are_described_and_their_activity_printed() -> None:
    hopper = {1: 70.0, 2: 50.0, 5: 25.0, 10: 20.0}
    mig = [FakeDevice(uuid="MIG-a", name="NVIDIA H100 80GB HBM3 MIG 3g.40gb", gi_id=2, gpm=dict(hopper),
                      fail={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED})]
    parent = FakeDevice(uuid="GPU-h", mig=mig, gpm=dict(hopper),
                        fail={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED})
    nv = FakeNvml([parent, FakeDevice(uuid="GPU-a100")])
    out = io.StringIO()
    rc = script().run_check(nv, seconds=0.0, interval=0.0, out=out)  # one sample: GPM has nothing yet
    text = out.getvalue()
    assert rc == 0, text
    assert "device 0: NVIDIA H100 80GB HBM3 GPU-h [MIG enabled]; GPM: yes" in text
    assert "device 1: NVIDIA H100 80GB HBM3 GPU-a100; GPM: no" in text
    assert "device 2: NVIDIA H100 80GB HBM3 MIG 3g.40gb MIG-a (MIG of GPU-h: GPU instance 2, profile 3g.40gb)" in text
    nv2 = FakeNvml([FakeDevice(uuid="GPU-h", gpm=dict(hopper))])
    out = io.StringIO()
    rc = script().run_check(nv2, seconds=0.05, interval=0.01, out=out)
    text = out.getvalue()
    assert rc == 0, text
    assert "sm_active_pct=50.0" in text and "tensor_active_pct=25.0" in text and "sm_clock_mhz=1980.0" in text
    for call in ("nvmlGpmSampleGet", "nvmlGpmMetricsGet", "clock SM", "memory temperature"):
        assert re.search(rf"^{re.escape(call)}\s+\d+\s+0\s", text, re.M), call  # each call's cost


def test_gpm_not_supported_by_the_driver_is_listed_not_failed() -> None:
    dev = FakeDevice(uuid="GPU-h", gpm={2: 1.0}, fail={"nvmlGpmSampleGet": NVML_ERROR_NOT_SUPPORTED,
                                                     "nvmlDeviceGetRemappedRows": NVML_ERROR_NOT_SUPPORTED})
    out = io.StringIO()
    rc = script().run_check(FakeNvml([dev]), seconds=0.05, interval=0.01, out=out)
    text = out.getvalue()
    assert rc == 0, text
    assert "gpu 0: nvmlGpmSampleGet" in text and "gpu 0: nvmlDeviceGetRemappedRows" in text
    assert "sm_active_pct=null" in text


def test_gpm_that_gives_nothing_fails_the_check() -> None:
    dev = FakeDevice(uuid="GPU-h", gpm={})  # supported, yet every metric comes back without a value
    out = io.StringIO()
    rc = script().run_check(FakeNvml([dev]), seconds=0.05, interval=0.01, out=out)
    assert rc == 1 and "GPM is supported but sample 2 has no activity metric" in out.getvalue()


def test_power_cap_lowers_each_limit_and_puts_it_back() -> None:
    dev = FakeDevice(uuid="GPU-x", util=0, limit_mw=650_000, limit_bounds_mw=(150_000, 700_000))
    out = io.StringIO()
    rc = script().run_check(FakeNvml([dev]), seconds=0.0, interval=0.0, out=out, power_cap=True)
    assert rc == 0, out.getvalue()
    assert "gpu 0: power limit bounds 150-700 W; 650 W -> 150 W -> 650 W" in out.getvalue()
    assert dev.limit_mw == 650_000


def test_a_power_limit_the_driver_will_not_set_fails_the_check() -> None:
    dev = FakeDevice(uuid="GPU-x", fail={"nvmlDeviceSetPowerManagementLimit": NVML_ERROR_NO_PERMISSION})
    out = io.StringIO()
    rc = script().run_check(FakeNvml([dev]), seconds=0.0, interval=0.0, out=out, power_cap=True)
    assert rc == 1 and "gpu 0: power cap: nvmlDeviceSetPowerManagementLimit" in out.getvalue()
