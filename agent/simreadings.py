"""What a simulated GPU reads for a given load: clocks, power, temperatures, energy, GPM activity, MIG.

Coherent by construction: clocks and power fall when the GPU idles, energy is power integrated over
the sampling clock, activity is a share of utilization set by the kind of job (a kernel that spins
has high utilization and low SM activity), and a MIG-enabled GPU sums its instances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from agent.sample import GpuReading
from agent.scenario import GpuModel, slices

#: job kind -> (SM activity, tensor activity, DRAM activity) as shares of utilization
ACTIVITY_BY_KIND: dict[str, tuple[float, float, float]] = {
    "training": (0.82, 0.45, 0.38),
    "forgotten": (0.6, 0.1, 0.2),
    "idle_holder": (0.5, 0.0, 0.1),
    "ghost": (0.0, 0.0, 0.0),
}
PCIE_PEAK_BYTES_S = 2.0e9


@dataclass(frozen=True, slots=True)
class Load:
    """One GPU's (or MIG instance's) work in one sample: utilization and activity in %, memory in MiB."""

    util: float = 0.0
    mem_mib: float = 0.0
    sm: float = 0.0
    tensor: float = 0.0
    dram: float = 0.0

    @classmethod
    def of(cls, util: float, mem_mib: float, ratios: tuple[float, float, float]) -> Load:
        sm, tensor, dram = ratios
        return cls(util=util, mem_mib=mem_mib, sm=util * sm, tensor=util * tensor, dram=util * dram)


@dataclass(frozen=True, slots=True)
class MigInstance:
    index: int
    parent: int
    profile: str
    gi_id: int
    uuid: str
    mem_total_mib: float

    @property
    def share(self) -> float:
        """Its share of the GPU's compute: 3/7 for a 3g profile."""
        return slices(self.profile) / 7.0


def pci_bus_id(node_index: int, gpu: int) -> str:
    return f"0000{node_index % 256:02X}00:{0x18 + 0x10 * gpu:02X}:00.0"


def physical(gm: GpuModel, index: int, uuid: str, load: Load, noise: float, energy_mj: int, node_index: int,
             *, mig_enabled: bool = False) -> GpuReading:
    """A physical GPU; with MIG enabled, `load` is its instances' share-weighted sum and NVML gives no
    utilization for it."""
    frac = load.util / 100.0
    lo_sm, hi_sm = gm.sm_clock_mhz
    lo_mem, hi_mem = gm.mem_clock_mhz
    temp = gm.idle_temp_c + (gm.busy_temp_c - gm.idle_temp_c) * frac + 2 * noise
    gpm = gm.has_gpm
    return GpuReading(
        index=index, uuid=uuid, model=gm.name, util_pct=None if mig_enabled else round(load.util, 1),
        mem_used_mib=round(load.mem_mib, 1), mem_total_mib=gm.mem_total_mib,
        temp_c=round(temp, 1),
        power_w=round(gm.idle_power_w + (gm.power_limit_w - gm.idle_power_w) * frac * 0.9, 1),
        power_limit_w=gm.power_limit_w, fan_pct=None, ecc_uncorrected=0,
        sm_clock_mhz=round(lo_sm + (hi_sm - lo_sm) * min(1.0, frac * 5.0)) * 1.0,
        mem_clock_mhz=hi_mem if load.util > 0 else lo_mem,
        mem_temp_c=round(temp + 3.0 + 4.0 * frac, 1), energy_mj=energy_mj, pcie_replays=0,
        mem_copy_util_pct=round(load.dram, 1), enc_util_pct=0.0, dec_util_pct=0.0,
        mem_reserved_mib=gm.mem_reserved_mib, remapped_rows_correctable=0, remapped_rows_uncorrectable=0,
        row_remap_failure=False, row_remap_pending=False, xid_watched=True, pci_bus_id=pci_bus_id(node_index, index),
        **(_gpm(load, noise) if gpm else _GpmFields()),
    )


def instance(gm: GpuModel, inst: MigInstance, parent_uuid: str, load: Load, node_index: int) -> GpuReading:
    """A MIG instance: memory, processes and (with GPM) activity, and a utilization from GPM; no power,
    temperature or clocks of its own, as NVML has none for it."""
    gpm = gm.has_gpm
    return GpuReading(
        index=inst.index, uuid=inst.uuid, model=f"{gm.name} MIG {inst.profile}",
        util_pct=round(load.util, 1) if gpm else None, mem_used_mib=round(load.mem_mib, 1),
        mem_total_mib=inst.mem_total_mib, mig_parent=parent_uuid, pci_bus_id=pci_bus_id(node_index, inst.parent),
        mig_gi_id=inst.gi_id, mig_profile=inst.profile, **(_gpm(load, 0.5) if gpm else _GpmFields()),
    )


class _GpmFields(TypedDict, total=False):
    """The GPM fields of a reading (none where the GPU has no GPM)."""

    gr_engine_active_pct: float
    sm_active_pct: float
    tensor_active_pct: float
    dram_active_pct: float
    pcie_tx_bytes_s: float
    pcie_rx_bytes_s: float


def _gpm(load: Load, noise: float) -> _GpmFields:
    frac = load.util / 100.0
    return {
        "gr_engine_active_pct": round(load.util, 1), "sm_active_pct": round(load.sm, 1),
        "tensor_active_pct": round(load.tensor, 1), "dram_active_pct": round(load.dram, 1),
        "pcie_tx_bytes_s": round(PCIE_PEAK_BYTES_S * frac * (0.2 + 0.3 * noise)),
        "pcie_rx_bytes_s": round(PCIE_PEAK_BYTES_S * frac * (0.4 + 0.4 * noise)),
    }


def combined(instances: list[tuple[MigInstance, Load]]) -> Load:
    """A MIG-enabled GPU's load: its instances' activity weighted by their share, their memory summed."""
    return Load(
        util=sum(ld.util * i.share for i, ld in instances), mem_mib=sum(ld.mem_mib for _, ld in instances),
        sm=sum(ld.sm * i.share for i, ld in instances), tensor=sum(ld.tensor * i.share for i, ld in instances),
        dram=sum(ld.dram * i.share for i, ld in instances),
    )
