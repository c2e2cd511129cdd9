"""The NVML sampler: nvidia-ml-py's `pynvml`, initialised once, handles kept, unsupported queries read as null."""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent.attribution import PsutilIdentifier
from agent.sample import GpuReading, NodeReading, ProcessIdentity, ProcReading, XidReading

log = logging.getLogger(__name__)

MIB = 1024 * 1024
_MAX_EVENTS_PER_SAMPLE = 64
#: a per-process SM sample older than this counts as 0%: the driver samples processes on its own
#: period, so a busy process can have no new sample between two of our reads
PROC_UTIL_FRESH_US = 5_000_000


class NvmlUnavailable(Exception):
    """NVML did not load or initialise on this machine (no driver, no GPU, no library)."""


class GpuLost(Exception):
    """A query answered NVML_ERROR_GPU_IS_LOST."""


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    model: str | None
    mig_parent: str | None = None
    is_mig_parent: bool = False
    lost: bool = False
    last_util_ts: int = 0
    #: pid -> (timestamp in µs, SM %) of its newest per-process sample
    proc_util: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class CallStats:
    """Latency of one NVML function across calls, for the real-GPU check."""

    calls: int = 0
    errors: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    codes: set[int] = field(default_factory=set)


def _handle_key(handle: Any) -> Any:
    """Handles are ctypes pointers: equal devices have equal addresses, not equal objects."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Reads every GPU and MIG instance through NVML; per-process memory and SM utilization; XIDs."""

    kind = "nvml"
    blocking = True

    def __init__(self, nvml: Any = None, *, identifier: PsutilIdentifier | None = None,
                 timing: bool = False) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
                raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is not installed: {e}") from None
            nvml = pynvml
        self.nv = nvml
        self.identifier = identifier or PsutilIdentifier()
        self.timing = timing
        self.stats: dict[str, CallStats] = {}
        self.errors: list[str] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._warned: set[tuple[int, str, int]] = set()
        try:
            self._time("nvmlInit", nvml.nvmlInit)
        except nvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML did not initialise: {e}") from None
        except OSError as e:
            raise NvmlUnavailable(f"the NVML library did not load: {e}") from None
        self.driver_version: str | None = self._static(-1, "nvmlSystemGetDriverVersion")
        self.devices: list[_Device] = []
        self._by_handle: dict[Any, _Device] = {}
        self._event_set: Any = None
        self._open_devices()
        self._open_events()

    # ------------------------------------------------------------ calls
    def _time(self, name: str, fn: Any, *args: Any) -> Any:
        if not self.timing:
            return fn(*args)
        st = self.stats.setdefault(name, CallStats())
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            st.errors += 1
            st.codes.add(int(e.value))
            raise
        finally:
            dt = time.perf_counter() - t0
            st.calls += 1
            st.total_s += dt
            st.max_s = max(st.max_s, dt)

    def _call(self, index: int, name: str, *args: Any) -> Any:
        """One NVML call; None when unsupported or failing. Raises GpuLost for a lost GPU."""
        if (index, name) in self._unsupported:
            return None
        fn = getattr(self.nv, name, None)
        if fn is None:
            self._unsupported.add((index, name))
            return None
        try:
            return self._time(name, fn, *args)
        except self.nv.NVMLError as e:
            code = int(e.value)
            if code == self.nv.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(name) from None
            if code in (self.nv.NVML_ERROR_NOT_SUPPORTED, self.nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported.add((index, name))
                return None
            if (index, name, code) not in self._warned:
                self._warned.add((index, name, code))
                msg = f"gpu {index}: {name} failed: {e} (code {code})"
                self.errors.append(msg)
                log.warning("%s; reported as null", msg)
            return None

    def _static(self, index: int, name: str, *args: Any) -> str | None:
        try:
            value = self._call(index, name, *args)
        except GpuLost:
            return None
        return None if value is None else _text(value)

    # ------------------------------------------------------------ setup
    def _open_devices(self) -> None:
        nv = self.nv
        count = int(self._time("nvmlDeviceGetCount", nv.nvmlDeviceGetCount))
        physical: list[_Device] = []
        for i in range(count):
            handle = self._time("nvmlDeviceGetHandleByIndex", nv.nvmlDeviceGetHandleByIndex, i)
            dev = _Device(index=i, handle=handle, uuid=self._static(i, "nvmlDeviceGetUUID", handle) or "",
                          model=self._static(i, "nvmlDeviceGetName", handle))
            physical.append(dev)
        migs: list[_Device] = []
        for dev in physical:
            try:
                mode = self._call(dev.index, "nvmlDeviceGetMigMode", dev.handle)
            except GpuLost:
                dev.lost = True
                continue
            if not mode or mode[0] != getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1):
                continue
            dev.is_mig_parent = True
            slots = self._call(dev.index, "nvmlDeviceGetMaxMigDeviceCount", dev.handle) or 0
            for j in range(int(slots)):
                try:
                    mh = self._time("nvmlDeviceGetMigDeviceHandleByIndex",
                                    nv.nvmlDeviceGetMigDeviceHandleByIndex, dev.handle, j)
                except nv.NVMLError:  # NOT_FOUND: an empty slot
                    continue
                idx = count + len(migs)
                migs.append(_Device(index=idx, handle=mh, uuid=self._static(idx, "nvmlDeviceGetUUID", mh) or "",
                                    model=self._static(idx, "nvmlDeviceGetName", mh), mig_parent=dev.uuid))
        self.devices = physical + migs
        self._by_handle = {_handle_key(d.handle): d for d in self.devices}

    def _open_events(self) -> None:
        nv = self.nv
        want = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        try:
            es = self._time("nvmlEventSetCreate", nv.nvmlEventSetCreate)
        except nv.NVMLError as e:
            log.info("no NVML event set (%s); XID errors will not be reported", e)
            return
        registered = 0
        for d in self.devices:
            if d.mig_parent is not None or d.lost:
                continue
            try:
                supported = self._call(d.index, "nvmlDeviceGetSupportedEventTypes", d.handle)
                if supported is None or not int(supported) & want:
                    continue
                self._time("nvmlDeviceRegisterEvents", nv.nvmlDeviceRegisterEvents, d.handle, want, es)
                registered += 1
            except (nv.NVMLError, GpuLost) as e:
                log.info("gpu %d: cannot register for XID events: %s", d.index, e)
        if registered:
            self._event_set = es
        else:
            self._time("nvmlEventSetFree", nv.nvmlEventSetFree, es)

    # ------------------------------------------------------------ sampling
    def sample(self, now: datetime) -> NodeReading:
        gpus: list[GpuReading] = []
        procs: list[ProcReading] = []
        for d in self.devices:
            if d.lost:
                gpus.append(self._lost(d))
                continue
            try:
                gpus.append(self._read_gpu(d))
                if not d.is_mig_parent:
                    procs.extend(self._read_procs(d, int(now.timestamp() * 1_000_000)))
            except GpuLost as e:
                d.lost = True
                log.error("gpu %d (%s) is lost (%s); reporting it as lost", d.index, d.uuid, e)
                gpus.append(self._lost(d))
        return NodeReading(gpus=tuple(gpus), procs=tuple(procs), xids=self._read_xids())

    def _lost(self, d: _Device) -> GpuReading:
        return GpuReading(index=d.index, uuid=d.uuid, model=d.model, mig_parent=d.mig_parent, lost=True)

    def _read_gpu(self, d: _Device) -> GpuReading:
        nv, i, h = self.nv, d.index, d.handle
        util = self._call(i, "nvmlDeviceGetUtilizationRates", h)
        mem = self._call(i, "nvmlDeviceGetMemoryInfo", h)
        temp = self._call(i, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        power = self._call(i, "nvmlDeviceGetPowerUsage", h)
        limit = self._call(i, "nvmlDeviceGetEnforcedPowerLimit", h)
        fan = self._call(i, "nvmlDeviceGetFanSpeed", h)
        ecc = self._call(i, "nvmlDeviceGetTotalEccErrors", h,
                         nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        return GpuReading(
            index=i, uuid=d.uuid, model=d.model,
            util_pct=float(util.gpu) if util is not None else None,
            mem_used_mib=round(mem.used / MIB, 2) if mem is not None else None,
            mem_total_mib=round(mem.total / MIB, 2) if mem is not None else None,
            temp_c=float(temp) if temp is not None else None,
            power_w=round(power / 1000.0, 3) if power is not None else None,
            power_limit_w=round(limit / 1000.0, 3) if limit is not None else None,
            fan_pct=float(fan) if fan is not None else None,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            mig_parent=d.mig_parent,
        )

    def _read_procs(self, d: _Device, now_us: int) -> list[ProcReading]:
        i, h = d.index, d.handle
        mem: dict[int, float | None] = {}
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in self._call(i, name, h) or []:
                used = None if p.usedGpuMemory is None else round(p.usedGpuMemory / MIB, 2)
                prev = mem.get(p.pid)
                mem[p.pid] = used if prev is None else max(prev, used or 0.0)
        if not mem:
            d.proc_util.clear()
            return []
        util = self._process_util(d, now_us, set(mem))
        return [
            ProcReading(pid=pid, gpu=i, mem_mib=m,
                        sm_util_pct=None if util is None else float(util.get(pid, 0)))
            for pid, m in mem.items()
        ]

    def _process_util(self, d: _Device, now_us: int, pids: set[int]) -> dict[int, int] | None:
        """SM % per pid from samples newer than PROC_UTIL_FRESH_US; None where unsupported; absent means 0."""
        name = "nvmlDeviceGetProcessUtilization"
        if (d.index, name) in self._unsupported:
            return None
        try:
            samples = self._time(name, self.nv.nvmlDeviceGetProcessUtilization, d.handle, d.last_util_ts)
        except self.nv.NVMLError as e:
            code = int(e.value)
            if code in (self.nv.NVML_ERROR_NOT_FOUND, 0):  # no samples since last_util_ts
                samples = []
            else:
                self._process_util_failed(d, name, e, code)
                return None
        for s in samples:
            ts = int(s.timeStamp)
            old = d.proc_util.get(s.pid)
            if old is None or ts >= old[0]:
                d.proc_util[s.pid] = (ts, int(s.smUtil))
            d.last_util_ts = max(d.last_util_ts, ts)
        for pid in [p for p in d.proc_util if p not in pids]:
            del d.proc_util[pid]
        return {pid: u for pid, (ts, u) in d.proc_util.items() if now_us - ts <= PROC_UTIL_FRESH_US}

    def _process_util_failed(self, d: _Device, name: str, e: Exception, code: int) -> None:
        """Unsupported: remembered, not asked again. Lost: raised. Anything else: logged once."""
        if code == self.nv.NVML_ERROR_GPU_IS_LOST:
            raise GpuLost(name) from None
        if code in (self.nv.NVML_ERROR_NOT_SUPPORTED, self.nv.NVML_ERROR_FUNCTION_NOT_FOUND):
            self._unsupported.add((d.index, name))
        elif (d.index, name, code) not in self._warned:
            self._warned.add((d.index, name, code))
            self.errors.append(f"gpu {d.index}: {name} failed: {e} (code {code})")
            log.warning("gpu %d: %s failed: %s", d.index, name, e)
        return None

    def _read_xids(self) -> tuple[XidReading, ...]:
        if self._event_set is None:
            return ()
        nv = self.nv
        want = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        found: list[XidReading] = []
        for _ in range(_MAX_EVENTS_PER_SAMPLE):
            try:
                data = self._time("nvmlEventSetWait", nv.nvmlEventSetWait, self._event_set, 0)
            except nv.NVMLError as e:
                if int(e.value) != nv.NVML_ERROR_TIMEOUT:
                    log.warning("reading NVML events failed: %s", e)
                break
            if not int(data.eventType) & want:
                continue
            dev = self._by_handle.get(_handle_key(data.device))
            found.append(XidReading(gpu=dev.index if dev else -1, xid=int(data.eventData)))
        return tuple(found)

    # ------------------------------------------------------------ processes, shutdown
    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        return self.identifier.identify(pids)

    def close(self) -> None:
        nv = self.nv
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
                self._event_set = None
            nv.nvmlShutdown()
        except nv.NVMLError as e:
            log.warning("NVML shutdown: %s", e)
