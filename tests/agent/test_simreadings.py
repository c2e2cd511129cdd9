"""What a simulated GPU reads, coherent by construction: an idle GPU is cool, slow and near its idle power, a busy
one hot, fast and near its limit; GPM activity as a share of utilization only on GPUs that have GPM; a MIG-enabled
GPU gives no utilization of its own and sums its instances by their share; instances have no power or clocks."""

from __future__ import annotations

import pytest

from agent.scenario import GpuModel
from agent.simreadings import ACTIVITY_BY_KIND, Load, MigInstance, combined, instance, pci_bus_id, physical

H100 = GpuModel()
A100 = GpuModel(name="NVIDIA A100-SXM4-80GB", power_limit_w=400, idle_power_w=50)


def test_an_idle_gpu_is_cool_and_slow_and_a_busy_one_hot_and_fast() -> None:  # busy: 70 W + 90 % of 630 W
    idle = physical(H100, 0, "GPU-0", Load(), noise=0.0, energy_mj=1000, node_index=3)
    busy = physical(H100, 0, "GPU-0", Load.of(100, 40_000, ACTIVITY_BY_KIND["training"]), noise=0.0,
                    energy_mj=2000, node_index=3)
    assert (idle.util_pct, idle.power_w, idle.sm_clock_mhz, idle.temp_c) == (0.0, 70.0, 345.0, 32.0)
    assert (busy.util_pct, busy.power_w, busy.sm_clock_mhz, busy.temp_c) == (100.0, 637.0, 1980.0, 72.0)
    assert busy.mem_used_mib == 40_000 and busy.energy_mj == 2000
    assert idle.pci_bus_id == busy.pci_bus_id == pci_bus_id(3, 0) == "00000300:18:00.0"


def test_gpm_activity_is_a_share_of_utilization_by_kind_and_only_where_the_gpu_has_gpm() -> None:
    load = Load.of(50, 1000, ACTIVITY_BY_KIND["idle_holder"])
    h100 = physical(H100, 1, "GPU-1", load, noise=0.0, energy_mj=0, node_index=0)
    assert (h100.sm_active_pct, h100.tensor_active_pct, h100.dram_active_pct) == (25.0, 0.0, 5.0)
    a100 = physical(A100, 1, "GPU-1", load, noise=0.0, energy_mj=0, node_index=0)
    assert a100.sm_active_pct is None and a100.util_pct == 50.0
    ghost = Load.of(90, 1000, ACTIVITY_BY_KIND["ghost"])
    assert physical(H100, 0, "GPU-0", ghost, noise=0.0, energy_mj=0, node_index=0).sm_active_pct == 0.0


def test_a_mig_gpu_sums_its_instances_by_share_and_reports_no_utilization() -> None:
    big = MigInstance(index=8, parent=0, profile="3g.40gb", gi_id=2, uuid="MIG-a", mem_total_mib=40_704)
    small = MigInstance(index=9, parent=0, profile="1g.10gb", gi_id=9, uuid="MIG-b", mem_total_mib=9_984)
    assert big.share == pytest.approx(3 / 7)
    loads = [(big, Load(util=70, mem_mib=30_000, sm=56)), (small, Load(util=35, mem_mib=5_000, sm=7))]
    total = combined(loads)
    assert total.util == pytest.approx(70 * 3 / 7 + 35 / 7) and total.mem_mib == 35_000
    gpu = physical(H100, 0, "GPU-0", total, noise=0.0, energy_mj=0, node_index=0, mig_enabled=True)
    assert gpu.util_pct is None and gpu.mem_used_mib == 35_000


def test_an_instance_has_memory_and_activity_but_no_power_or_clocks() -> None:
    inst = MigInstance(index=8, parent=1, profile="3g.40gb", gi_id=2, uuid="MIG-a", mem_total_mib=40_704)
    r = instance(H100, inst, "GPU-1", Load(util=70, mem_mib=30_000, sm=56), node_index=2)
    assert (r.model, r.mig_parent, r.mig_gi_id, r.mig_profile) == ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "GPU-1",
                                                                    2, "3g.40gb")
    assert (r.util_pct, r.sm_active_pct, r.mem_total_mib) == (70.0, 56.0, 40_704)
    assert r.power_w is None and r.sm_clock_mhz is None and r.temp_c is None
    assert r.pci_bus_id == pci_bus_id(2, 1)
    assert instance(A100, inst, "GPU-1", Load(util=70), node_index=2).util_pct is None  # no GPM: NVML has none
