"""scripts/check_nvml.py against the stand-in pynvml: prints fields and latencies; non-zero on failure."""

from __future__ import annotations

import importlib.util
import io
import os
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
