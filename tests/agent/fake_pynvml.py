"""A stand-in for nvidia-ml-py's `pynvml`: the same function names, error class and codes; devices in memory."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypePState = 0x4
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
nvmlMemory_v2 = 0x02000028
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_GRAPHICS_UTIL = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRIC_PCIE_TX_PER_SEC = 20
NVML_GPM_METRIC_PCIE_RX_PER_SEC = 21

MIB = 1024 * 1024


class NVMLError(Exception):
    """As in pynvml: `.value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return f"NVML error {self.value}"


@dataclass
class FakeDevice:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util: int = 0
    mem_used_mib: int = 0
    mem_total_mib: int = 81559
    temp: int = 35
    power_mw: int = 70_000
    limit_mw: int = 700_000
    limit_bounds_mw: tuple[int, int] = (200_000, 700_000)  # nvmlDeviceGetPowerManagementLimitConstraints
    fan: int = 30
    ecc: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used MiB)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    mps: list[tuple[int, int | None]] = field(default_factory=list)  # MPS clients (the server is in `compute`)
    #: per-process SM samples: (pid, timestamp in microseconds, smUtil)
    proc_util: list[tuple[int, int, int]] = field(default_factory=list)
    #: function name -> NVML error code it raises for this device
    fail: dict[str, int] = field(default_factory=dict)
    mig: list[FakeDevice] | None = None
    events: int = nvmlEventTypeXidCriticalError | nvmlEventTypePState
    sm_clock: int = 1980
    mem_clock: int = 2619
    mem_temp: int | None = 41  # None: the field value is not supported
    energy_mj: int = 123_456_789
    pcie_replays: int = 0
    mem_util: int = 0
    enc: int = 0
    dec: int = 0
    reserved_mib: int = 512
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failure
    bus_id: str = "00000000:07:00.0"
    gi_id: int | None = None  # a MIG instance's GPU instance id
    #: GPM metric id -> value over the last interval; None: the GPU has no GPM
    gpm: dict[int, float] | None = None


@dataclass
class FakeGpmSample:
    """What `nvmlGpmSampleAlloc` hands out; a fill records whose values it holds."""

    device: FakeDevice | None = None
    values: dict[int, float] = field(default_factory=dict)
    freed: bool = False


class FakeGpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:  # pynvml's name for the request
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [FakeGpmMetric() for _ in range(16)]


_MetricsGet = c_nvmlGpmMetricsGet_t  # the request's type, by a name FakeNvml's attribute does not shadow


class FakeNvml:
    """Module-like: `FakeNvml(devices)` has the pynvml functions the sampler uses as methods."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
    NVML_GPM_METRICS_GET_VERSION: int  # set with the other NVML_ constants in __init__

    def __init__(self, devices: list[FakeDevice], *, driver: str = "550.54.15",
                 init_error: int | None = None) -> None:
        self.devices = devices
        self.driver = driver
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.util_timestamps: list[int] = []
        self.pending_xids: list[tuple[FakeDevice, int]] = []
        self.gpm_samples: list[FakeGpmSample] = []
        self.initialised = False
        for k, v in globals().items():
            if k.startswith(("NVML_", "nvmlEventType", "nvmlMemory_")):
                setattr(self, k, v)

    def _dev(self, name: str, handle: FakeDevice) -> FakeDevice:
        self.calls[name] += 1
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        code = handle.fail.get(name)
        if code is not None:
            raise NVMLError(code)
        return handle

    # ---------------------------------------------------------------- library
    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls["nvmlSystemGetDriverVersion"] += 1
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDevice:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        if index >= len(self.devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.devices[index]

    def nvmlDeviceGetIndex(self, handle: FakeDevice) -> int:
        return self.devices.index(self._dev("nvmlDeviceGetIndex", handle))

    # ---------------------------------------------------------------- static
    def nvmlDeviceGetName(self, handle: FakeDevice) -> str:
        return self._dev("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: FakeDevice) -> str:
        return self._dev("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetMigMode(self, handle: FakeDevice) -> list[int]:
        d = self._dev("nvmlDeviceGetMigMode", handle)
        mode = NVML_DEVICE_MIG_ENABLE if d.mig is not None else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeDevice) -> int:
        d = self._dev("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7 if d.mig is not None else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeDevice, index: int) -> FakeDevice:
        d = self._dev("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if d.mig is None or index >= len(d.mig):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return d.mig[index]

    # ---------------------------------------------------------------- readings
    def nvmlDeviceGetUtilizationRates(self, handle: FakeDevice) -> Any:
        d = self._dev("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=d.util, memory=d.mem_util)

    def nvmlDeviceGetClockInfo(self, handle: FakeDevice, type: int) -> int:
        d = self._dev("nvmlDeviceGetClockInfo", handle)
        return {NVML_CLOCK_SM: d.sm_clock, NVML_CLOCK_MEM: d.mem_clock}[type]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetPcieReplayCounter", handle).pcie_replays

    def nvmlDeviceGetEncoderUtilization(self, handle: FakeDevice) -> list[int]:
        return [self._dev("nvmlDeviceGetEncoderUtilization", handle).enc, 167_000]

    def nvmlDeviceGetDecoderUtilization(self, handle: FakeDevice) -> list[int]:
        return [self._dev("nvmlDeviceGetDecoderUtilization", handle).dec, 167_000]

    def nvmlDeviceGetRemappedRows(self, handle: FakeDevice) -> tuple[int, int, int, int]:
        return self._dev("nvmlDeviceGetRemappedRows", handle).remapped

    def nvmlDeviceGetPciInfo(self, handle: FakeDevice) -> Any:
        return SimpleNamespace(busId=self._dev("nvmlDeviceGetPciInfo", handle).bus_id.encode())

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeDevice) -> int:
        d = self._dev("nvmlDeviceGetGpuInstanceId", handle)
        if d.gi_id is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return d.gi_id

    def nvmlDeviceGetFieldValues(self, handle: FakeDevice, field_ids: list[int]) -> list[Any]:
        d = self._dev("nvmlDeviceGetFieldValues", handle)
        out = []
        for fid in field_ids:
            value = d.mem_temp if fid == NVML_FI_DEV_MEMORY_TEMP else None
            out.append(SimpleNamespace(fieldId=fid, nvmlReturn=NVML_ERROR_NOT_SUPPORTED if value is None else 0,
                                       valueType=NVML_VALUE_TYPE_UNSIGNED_INT,
                                       value=SimpleNamespace(uiVal=value or 0)))
        return out

    # ---------------------------------------------------------------- GPM
    def nvmlGpmQueryDeviceSupport(self, handle: FakeDevice) -> Any:
        d = self._dev("nvmlGpmQueryDeviceSupport", handle)
        return SimpleNamespace(version=1, isSupportedDevice=int(d.gpm is not None))

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self.calls["nvmlGpmSampleAlloc"] += 1
        sample = FakeGpmSample()
        self.gpm_samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        self.calls["nvmlGpmSampleFree"] += 1
        sample.freed = True

    def _fill(self, device: FakeDevice, sample: FakeGpmSample) -> FakeGpmSample:
        if device.gpm is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        assert not sample.freed
        sample.device, sample.values = device, dict(device.gpm)
        return sample

    def nvmlGpmSampleGet(self, handle: FakeDevice, sample: FakeGpmSample) -> FakeGpmSample:
        return self._fill(self._dev("nvmlGpmSampleGet", handle), sample)

    def nvmlGpmMigSampleGet(self, handle: FakeDevice, gpu_instance_id: int, sample: FakeGpmSample) -> FakeGpmSample:
        d = self._dev("nvmlGpmMigSampleGet", handle)
        found = [m for m in d.mig or [] if m.gi_id == gpu_instance_id]
        if not found:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._fill(found[0], sample)

    def nvmlGpmMetricsGet(self, request: _MetricsGet) -> _MetricsGet:
        self.calls["nvmlGpmMetricsGet"] += 1
        s1, s2 = request.sample1, request.sample2
        assert request.version == NVML_GPM_METRICS_GET_VERSION
        if s1 is None or s2 is None or s1.device is None or s1.device is not s2.device or s1 is s2:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for m in request.metrics[: request.numMetrics]:
            if m.metricId in s2.values:
                m.nvmlReturn, m.value = NVML_SUCCESS, s2.values[m.metricId]
            else:
                m.nvmlReturn, m.value = NVML_ERROR_NOT_SUPPORTED, 0.0
        return request

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice, version: Any = None) -> Any:
        d = self._dev("nvmlDeviceGetMemoryInfo", handle)  # a failure of v1 is one of v2 too
        if version is not None:
            self._dev("nvmlDeviceGetMemoryInfo_v2", handle)
        mem = SimpleNamespace(total=d.mem_total_mib * MIB, used=d.mem_used_mib * MIB,
                              free=(d.mem_total_mib - d.mem_used_mib) * MIB)
        if version is not None:
            assert version == nvmlMemory_v2
            mem.reserved = d.reserved_mib * MIB
        return mem

    def nvmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._dev("nvmlDeviceGetTemperature", handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", handle).limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeDevice) -> list[int]:
        return list(self._dev("nvmlDeviceGetPowerManagementLimitConstraints", handle).limit_bounds_mw)

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetPowerManagementLimit", handle).limit_mw

    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeDevice, limit: int) -> None:
        """As the driver: INVALID_ARGUMENT outside the bounds; the draw follows a lower limit."""
        d = self._dev("nvmlDeviceSetPowerManagementLimit", handle)
        low, high = d.limit_bounds_mw
        if not low <= limit <= high:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        d.limit_mw = limit
        d.power_mw = min(d.power_mw, limit)

    def nvmlDeviceGetFanSpeed(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetFanSpeed", handle).fan

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeDevice, error_type: int, counter_type: int) -> int:
        assert (error_type, counter_type) == (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
        return self._dev("nvmlDeviceGetTotalEccErrors", handle).ecc

    def _procs(self, rows: list[tuple[int, int | None]]) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=None if m is None else m * MIB,
                                gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF) for pid, m in rows]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeDevice) -> list[Any]:
        return self._procs(self._dev("nvmlDeviceGetComputeRunningProcesses", handle).compute)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: FakeDevice) -> list[Any]:
        return self._procs(self._dev("nvmlDeviceGetMPSComputeRunningProcesses", handle).mps)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeDevice) -> list[Any]:
        return self._procs(self._dev("nvmlDeviceGetGraphicsRunningProcesses", handle).graphics)

    def nvmlDeviceGetProcessUtilization(self, handle: FakeDevice, timeStamp: int) -> list[Any]:
        d = self._dev("nvmlDeviceGetProcessUtilization", handle)
        self.util_timestamps.append(timeStamp)
        rows = [s for s in d.proc_util if s[1] > timeStamp]
        if not rows:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=p, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
                for p, ts, sm in rows]

    # ---------------------------------------------------------------- events
    def nvmlEventSetCreate(self) -> object:
        self.calls["nvmlEventSetCreate"] += 1
        return object()

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetSupportedEventTypes", handle).events

    def nvmlDeviceRegisterEvents(self, handle: FakeDevice, event_types: int, event_set: object) -> None:
        self._dev("nvmlDeviceRegisterEvents", handle)

    def nvmlEventSetWait(self, event_set: object, timeoutms: int) -> Any:
        self.calls["nvmlEventSetWait"] += 1
        if not self.pending_xids:
            raise NVMLError(NVML_ERROR_TIMEOUT)
        dev, xid = self.pending_xids.pop(0)
        return SimpleNamespace(device=dev, eventType=nvmlEventTypeXidCriticalError, eventData=xid,
                               gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

    def nvmlEventSetFree(self, event_set: object) -> None:
        self.calls["nvmlEventSetFree"] += 1
