"""The NVML sampler: nvidia-ml-py's `pynvml`, initialised once, handles kept, unsupported queries read as null."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

from agent.attribution import PsutilIdentifier
from agent.gpm import GpmReader
from agent.nvmlcalls import (
    MIB,
    GpuLost,
    NvmlCaller,
    NvmlUnavailable,
    _Device,
    _handle_key,
    _num,
    _text,
    mig_profile,
)
from agent.sample import GpuReading, NodeReading, PowerLimitError, ProcessIdentity, ProcReading, XidReading

log = logging.getLogger(__name__)

_MAX_EVENTS_PER_SAMPLE = 64
#: a per-process SM sample older than this counts as 0%: the driver samples processes on its own
#: period, so a busy process can have no new sample between two of our reads
PROC_UTIL_FRESH_US = 5_000_000
#: counters that move rarely (remapped rows, PCIe replays) are read once every this many samples
SLOW_EVERY = 10
_NVML_FI_DEV_MEMORY_TEMP = 82
#: NVML's value union member for each `valueType` of a field value
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


class ProcessIdentifier(Protocol):
    """Who runs each pid (PsutilIdentifier reads /proc; tests give pids that are not real)."""

    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]: ...


class NvmlSampler(NvmlCaller):
    """Reads every GPU and MIG instance through NVML; per-process memory and SM utilization; XIDs."""

    kind = "nvml"
    blocking = True

    def __init__(self, nvml: Any = None, *, identifier: ProcessIdentifier | None = None,
                 timing: bool = False) -> None:
        if nvml is None:
            try:
                import pynvml
            except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
                raise NvmlUnavailable(f"the pynvml module (nvidia-ml-py) is not installed: {e}") from None
            nvml = pynvml
        super().__init__(nvml, timing=timing)
        self.identifier = identifier or PsutilIdentifier()
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
        self.gpm = GpmReader(nvml, self._call)
        self._open_devices()
        self._open_events()
        self._open_gpm()

    def _open_devices(self) -> None:
        nv = self.nv
        count = int(self._time("nvmlDeviceGetCount", nv.nvmlDeviceGetCount))
        physical: list[_Device] = []
        for i in range(count):
            handle = self._time("nvmlDeviceGetHandleByIndex", nv.nvmlDeviceGetHandleByIndex, i)
            dev = _Device(index=i, handle=handle, uuid=self._static(i, "nvmlDeviceGetUUID", handle) or "",
                          model=self._static(i, "nvmlDeviceGetName", handle), pci_bus_id=self._bus_id(i, handle))
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
                name = self._static(idx, "nvmlDeviceGetName", mh)
                try:
                    gi = self._call(idx, "nvmlDeviceGetGpuInstanceId", mh)
                except GpuLost:
                    gi = None
                migs.append(_Device(index=idx, handle=mh, uuid=self._static(idx, "nvmlDeviceGetUUID", mh) or "",
                                    model=name, mig_parent=dev.uuid, pci_bus_id=dev.pci_bus_id,
                                    gi_id=None if gi is None else int(gi), profile=mig_profile(name)))
        self.devices = physical + migs
        self._by_handle = {_handle_key(d.handle): d for d in self.devices}

    def _bus_id(self, index: int, handle: Any) -> str | None:
        try:
            info = self._call(index, "nvmlDeviceGetPciInfo", handle)
        except GpuLost:
            return None
        bus = getattr(info, "busId", None) if info is not None else None
        return _text(bus) if bus else None

    def _open_gpm(self) -> None:
        """Watch with GPM every GPU that has it, and the MIG instances of those that have it."""
        parents = {d.uuid: d for d in self.devices if d.mig_parent is None}
        has_gpm: dict[str, bool] = {}
        for d in self.devices:
            if d.lost:
                continue
            try:
                if d.mig_parent is None:
                    has_gpm[d.uuid] = self.gpm.supported(d.index, d.handle)
                    if has_gpm[d.uuid]:
                        self.gpm.watch(d.index, d.handle)
                elif has_gpm.get(d.mig_parent) and d.gi_id is not None:
                    self.gpm.watch(d.index, parents[d.mig_parent].handle, d.gi_id)
            except GpuLost:
                d.lost = True
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
                d.xid_watched = True
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
        d.samples += 1
        util = self._call(i, "nvmlDeviceGetUtilizationRates", h)
        mem = self._memory(d)
        temp = self._call(i, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        power = self._call(i, "nvmlDeviceGetPowerUsage", h)
        limit = self._call(i, "nvmlDeviceGetEnforcedPowerLimit", h)
        fan = self._call(i, "nvmlDeviceGetFanSpeed", h)
        ecc = self._call(i, "nvmlDeviceGetTotalEccErrors", h,
                         nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        sm_clock = self._call(i, "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", 1), key="clock SM")
        mem_clock = self._call(i, "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", 2), key="clock MEM")
        energy = self._call(i, "nvmlDeviceGetTotalEnergyConsumption", h)
        enc = self._call(i, "nvmlDeviceGetEncoderUtilization", h)
        dec = self._call(i, "nvmlDeviceGetDecoderUtilization", h)
        replays = self._slow(d, "nvmlDeviceGetPcieReplayCounter")
        remap = self._slow(d, "nvmlDeviceGetRemappedRows")
        gpm = self.gpm.read(i)
        nvml_util = float(util.gpu) if util is not None else None
        # MIG instances have no NVML utilization: GPM's graphics-engine activity is the same measure
        util_pct = nvml_util if nvml_util is not None or d.is_mig_parent else gpm.get("gr_engine_active_pct")
        return GpuReading(
            index=i, uuid=d.uuid, model=d.model,
            util_pct=util_pct,
            mem_used_mib=round(mem.used / MIB, 2) if mem is not None else None,
            mem_total_mib=round(mem.total / MIB, 2) if mem is not None else None,
            temp_c=_num(temp),
            power_w=round(power / 1000.0, 3) if power is not None else None,
            power_limit_w=round(limit / 1000.0, 3) if limit is not None else None,
            fan_pct=_num(fan),
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            mig_parent=d.mig_parent,
            sm_clock_mhz=_num(sm_clock), mem_clock_mhz=_num(mem_clock),
            mem_temp_c=self._field(d, "memory temperature", _NVML_FI_DEV_MEMORY_TEMP),
            energy_mj=int(energy) if energy is not None else None,
            pcie_replays=int(replays) if replays is not None else None,
            mem_copy_util_pct=float(util.memory) if util is not None else None,
            enc_util_pct=float(enc[0]) if enc is not None else None,
            dec_util_pct=float(dec[0]) if dec is not None else None,
            mem_reserved_mib=(round(mem.reserved / MIB, 2)
                              if mem is not None and getattr(mem, "reserved", None) is not None else None),
            remapped_rows_correctable=int(remap[0]) if remap is not None else None,
            remapped_rows_uncorrectable=int(remap[1]) if remap is not None else None,
            row_remap_failure=bool(remap[3]) if remap is not None else None,
            row_remap_pending=bool(remap[2]) if remap is not None else None,
            xid_watched=d.xid_watched,
            gr_engine_active_pct=gpm.get("gr_engine_active_pct"), sm_active_pct=gpm.get("sm_active_pct"),
            tensor_active_pct=gpm.get("tensor_active_pct"), dram_active_pct=gpm.get("dram_active_pct"),
            pcie_tx_bytes_s=gpm.get("pcie_tx_bytes_s"), pcie_rx_bytes_s=gpm.get("pcie_rx_bytes_s"),
            pci_bus_id=d.pci_bus_id, mig_gi_id=d.gi_id, mig_profile=d.profile,
        )

    def _memory(self, d: _Device) -> Any:
        """Memory info v2 (it has `reserved`) where the driver has it, else v1."""
        v2 = getattr(self.nv, "nvmlMemory_v2", None)
        if v2 is not None:
            mem = self._call(d.index, "nvmlDeviceGetMemoryInfo", d.handle, v2, key="nvmlDeviceGetMemoryInfo_v2")
            if mem is not None:
                return mem
        return self._call(d.index, "nvmlDeviceGetMemoryInfo", d.handle)

    def _slow(self, d: _Device, name: str) -> Any:
        """A counter that rarely moves, read once every SLOW_EVERY samples; the last reading in between."""
        if name not in d.slow or d.samples % SLOW_EVERY == 1:
            d.slow[name] = self._call(d.index, name, d.handle)
        return d.slow[name]

    def _field(self, d: _Device, key: str, field_id: int) -> float | None:
        """One NVML field value (`nvmlDeviceGetFieldValues`), None when the GPU does not report it."""
        got = self._call(d.index, "nvmlDeviceGetFieldValues", d.handle, [field_id], key=key)
        if not got:
            return None
        v = got[0]
        if int(v.nvmlReturn) != 0:
            if int(v.nvmlReturn) in self._unsupported_codes():
                self._unsupported.add((d.index, key))
            return None
        member = _VALUE_MEMBER.get(int(v.valueType))
        return None if member is None else float(getattr(v.value, member))

    def _read_procs(self, d: _Device, now_us: int) -> list[ProcReading]:
        i, h = d.index, d.handle
        mem: dict[int, float | None] = {}
        # MPS: its clients are listed apart; the core gives the GPU to them, not to the MPS server (agent/core.py)
        for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses",
                     "nvmlDeviceGetMPSComputeRunningProcesses"):
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

    # ------------------------------------------------------------ power limits (the power_cap command)
    def _whole(self, index: int) -> _Device:
        d = next((d for d in self.devices if d.index == index), None)
        if d is None or d.lost or d.mig_parent is not None:
            raise PowerLimitError(f"no GPU {index} whose power limit can be set")
        return d

    def _power_call(self, index: int, name: str, *args: Any) -> Any:
        d = self._whole(index)
        try:
            return self._time(name, getattr(self.nv, name), d.handle, *args)
        except (self.nv.NVMLError, AttributeError) as e:
            raise PowerLimitError(f"{name}: {e}") from None

    def power_bounds(self, index: int) -> tuple[float, float]:
        low, high = self._power_call(index, "nvmlDeviceGetPowerManagementLimitConstraints")
        return low / 1000.0, high / 1000.0

    def power_limit(self, index: int) -> float:
        return float(self._power_call(index, "nvmlDeviceGetPowerManagementLimit")) / 1000.0

    def set_power_limit(self, index: int, watts: float) -> None:
        """Needs root; NVML keeps it until the driver unloads (or the next set)."""
        self._power_call(index, "nvmlDeviceSetPowerManagementLimit", round(watts * 1000))

    # ------------------------------------------------------------ processes, shutdown
    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        return self.identifier.identify(pids)

    def close(self) -> None:
        nv = self.nv
        self.gpm.close()
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
                self._event_set = None
            nv.nvmlShutdown()
        except nv.NVMLError as e:
            log.warning("NVML shutdown: %s", e)
