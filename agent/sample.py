"""What a sampler reads from one node at one instant, and the protocols a sampler implements."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU (or MIG instance) as read; `None` where the hardware does not say."""

    index: int
    uuid: str
    model: str | None = None
    util_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    ecc_uncorrected: int | None = None
    mig_parent: str | None = None
    lost: bool = False
    # dcgm-exporter's default counters, as NVML gives them
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    mem_temp_c: float | None = None
    energy_mj: int | None = None  # since the driver loaded: a counter
    pcie_replays: int | None = None  # a counter
    mem_copy_util_pct: float | None = None
    enc_util_pct: float | None = None
    dec_util_pct: float | None = None
    mem_reserved_mib: float | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    row_remap_failure: bool | None = None
    row_remap_pending: bool | None = None  # a row remap waits for the next GPU reset
    #: XID errors are watched on this GPU (an event set is registered): no XID yet reads 0, not null
    xid_watched: bool = False
    # GPM (Hopper and later, MIG instances too): percentages over the last sample interval
    gr_engine_active_pct: float | None = None
    sm_active_pct: float | None = None
    tensor_active_pct: float | None = None
    dram_active_pct: float | None = None
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None
    # static: PCI bus id; for a MIG instance its GPU instance id and profile (`1g.10gb`)
    pci_bus_id: str | None = None
    mig_gi_id: int | None = None
    mig_profile: str | None = None

    @property
    def mem_pct(self) -> float | None:
        if self.mem_used_mib is None or not self.mem_total_mib:
            return None
        return round(100.0 * self.mem_used_mib / self.mem_total_mib, 2)


@dataclass(frozen=True, slots=True)
class ProcReading:
    """One process on one GPU: its GPU memory and its share of the GPU's SMs."""

    pid: int
    gpu: int
    mem_mib: float | None = None
    sm_util_pct: float | None = None


@dataclass(frozen=True, slots=True)
class XidReading:
    gpu: int
    xid: int


@dataclass(frozen=True, slots=True)
class NodeReading:
    """Everything one sample read: GPUs, the processes holding them, XID errors since the last sample."""

    gpus: tuple[GpuReading, ...]
    procs: tuple[ProcReading, ...] = ()
    xids: tuple[XidReading, ...] = ()


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """Who a GPU process is: read once per (pid, create_time) and cached."""

    pid: int
    create_time: datetime
    name: str = ""
    exe: str = ""
    cmdline: str = ""
    user: str | None = None
    uid: int | None = None
    ppid: int | None = None
    service: str | None = None
    job: str | None = None
    container_id: str | None = None
    pod_uid: str | None = None
    pod: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    owner: str | None = None
    container: str | None = None  # the container's name in its pod (from the kubelet)


@dataclass(frozen=True, slots=True)
class LiveProcess:
    """A process as it is right now, for the kill command's checks."""

    pid: int
    create_time: datetime
    user: str | None
    name: str
    exe: str = ""  # /proc/<pid>/exe; empty when unknown


class Sampler(Protocol):
    """Reads GPUs and names the processes on them."""

    kind: str
    driver_version: str | None
    #: True when `sample` makes blocking calls (NVML) and belongs in a worker thread.
    blocking: bool

    def sample(self, now: datetime) -> NodeReading: ...

    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]: ...

    def close(self) -> None: ...


class AccessDenied(Exception):
    """The agent may not look at or signal this process (it runs without CAP_KILL / root)."""


class ProcessControl(Protocol):
    """Looks up and signals processes, for the kill command."""

    def lookup(self, pid: int) -> LiveProcess | None:
        """The live process, None when there is none; raises AccessDenied when it may not be read."""
        ...

    def send(self, pid: int, create_time: datetime, signal_name: str) -> bool:
        """Signal the process if it is still the same one; False when it is gone; AccessDenied if not allowed."""
        ...

    def alive(self, pid: int, create_time: datetime) -> bool: ...


class PowerLimitError(Exception):
    """The driver would not read or set a power limit (not supported, no permission)."""


@runtime_checkable
class PowerControl(Protocol):
    """A sampler that can read and set its GPUs' power limits, in watts (the power_cap command)."""

    def power_bounds(self, index: int) -> tuple[float, float]:
        """The lowest and highest limit the GPU takes; raises PowerLimitError."""
        ...

    def power_limit(self, index: int) -> float:
        """The limit set now; raises PowerLimitError."""
        ...

    def set_power_limit(self, index: int, watts: float) -> None:
        """Set the limit; raises PowerLimitError."""
        ...
