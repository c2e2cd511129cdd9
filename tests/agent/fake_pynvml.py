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
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
nvmlEventTypeXidCriticalError = 0x8
nvmlEventTypePState = 0x4

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
    fan: int = 30
    ecc: int = 0
    compute: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used MiB)
    graphics: list[tuple[int, int | None]] = field(default_factory=list)
    #: per-process SM samples: (pid, timestamp in microseconds, smUtil)
    proc_util: list[tuple[int, int, int]] = field(default_factory=list)
    #: function name -> NVML error code it raises for this device
    fail: dict[str, int] = field(default_factory=dict)
    mig: list[FakeDevice] | None = None
    events: int = nvmlEventTypeXidCriticalError | nvmlEventTypePState


class FakeNvml:
    """Module-like: `FakeNvml(devices)` has the pynvml functions the sampler uses as methods."""

    NVMLError = NVMLError

    def __init__(self, devices: list[FakeDevice], *, driver: str = "550.54.15",
                 init_error: int | None = None) -> None:
        self.devices = devices
        self.driver = driver
        self.init_error = init_error
        self.calls: Counter[str] = Counter()
        self.util_timestamps: list[int] = []
        self.pending_xids: list[tuple[FakeDevice, int]] = []
        self.initialised = False
        for k, v in globals().items():
            if k.startswith(("NVML_", "nvmlEventType")):
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
        return SimpleNamespace(gpu=d.util, memory=0)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDevice, version: Any = None) -> Any:
        d = self._dev("nvmlDeviceGetMemoryInfo", handle)
        return SimpleNamespace(total=d.mem_total_mib * MIB, used=d.mem_used_mib * MIB,
                               free=(d.mem_total_mib - d.mem_used_mib) * MIB)

    def nvmlDeviceGetTemperature(self, handle: FakeDevice, sensor: int) -> int:
        assert sensor == NVML_TEMPERATURE_GPU
        return self._dev("nvmlDeviceGetTemperature", handle).temp

    def nvmlDeviceGetPowerUsage(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeDevice) -> int:
        return self._dev("nvmlDeviceGetEnforcedPowerLimit", handle).limit_mw

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
