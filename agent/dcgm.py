"""dcgm-exporter's series as the agent serves them: field names, types, help texts and labels.

Names, types and help texts are those of dcgm-exporter's `etc/default-counters.csv` (4.x), for every
counter NVML can give; `DCGM_FI_PROF_*` ratios come from GPM. Labels are dcgm-exporter's: `gpu`,
`UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`, `DCGM_FI_DRIVER_VERSION`; a MIG instance is
labelled with its GPU's `gpu`/`UUID`/`device` plus `GPU_I_PROFILE` and `GPU_I_ID`; a GPU whose
processes run in pods carries `pod`, `namespace`, `container` (one series per pod, as its Kubernetes
mode does), and one in Slurm jobs `hpc_job` (one series per job, as its HPC job mapping does).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from agent.core import HeldProcess
from agent.sample import GpuReading

#: the labels dcgm-exporter puts on every GPU series, so its Grafana dashboards work unchanged
DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]
#: labels present where they apply: PCI bus, driver, MIG instance, pod, Slurm job
DCGM_OPTIONAL_LABELS = ["pci_bus_id", "DCGM_FI_DRIVER_VERSION", "GPU_I_PROFILE", "GPU_I_ID",
                        "pod", "namespace", "container", "hpc_job"]

Labels = dict[str, str]


def _ratio(pct: float | None) -> float | None:
    return None if pct is None else round(pct / 100.0, 6)


def _free(r: GpuReading) -> float | None:
    if r.mem_total_mib is None or r.mem_used_mib is None:
        return None
    return round(r.mem_total_mib - r.mem_used_mib - (r.mem_reserved_mib or 0.0), 2)


@dataclass(frozen=True, slots=True)
class DcgmField:
    name: str
    type: Literal["gauge", "counter"]
    help: str
    value: Callable[[GpuReading], float | None]


DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda r: r.sm_clock_mhz),
    DcgmField("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda r: r.mem_clock_mhz),
    DcgmField("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", lambda r: r.mem_temp_c),
    DcgmField("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda r: r.temp_c),
    DcgmField("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda r: r.power_w),
    DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
              "Total energy consumption since boot (in mJ).", lambda r: r.energy_mj),
    DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
              lambda r: r.pcie_replays),
    DcgmField("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda r: r.util_pct),
    DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda r: r.mem_copy_util_pct),
    DcgmField("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", lambda r: r.enc_util_pct),
    DcgmField("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", lambda r: r.dec_util_pct),
    DcgmField("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _free),
    DcgmField("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda r: r.mem_used_mib),
    DcgmField("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
              lambda r: r.mem_reserved_mib),
    DcgmField("DCGM_FI_DEV_FAN_SPEED", "gauge", "Fan speed (in 0-100%).", lambda r: r.fan_pct),
    DcgmField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
              lambda r: r.ecc_uncorrected),
    DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
              "Number of remapped rows for uncorrectable errors", lambda r: r.remapped_rows_uncorrectable),
    DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
              "Number of remapped rows for correctable errors", lambda r: r.remapped_rows_correctable),
    DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
              lambda r: None if r.row_remap_failure is None else float(r.row_remap_failure)),
    DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
              lambda r: _ratio(r.gr_engine_active_pct)),
    DcgmField("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
              lambda r: _ratio(r.sm_active_pct)),
    DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
              lambda r: _ratio(r.tensor_active_pct)),
    DcgmField("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
              "Ratio of cycles the device memory interface is active sending or receiving data.",
              lambda r: _ratio(r.dram_active_pct)),
    DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
              "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
              "payloads - in bytes per second.", lambda r: r.pcie_tx_bytes_s),
    DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
              "The rate of data received over the PCIe bus - including both protocol headers and data "
              "payloads - in bytes per second.", lambda r: r.pcie_rx_bytes_s),
)
XID_FIELD = DcgmField("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
                      lambda r: None)


def xid_value(r: GpuReading, last_xid: int | None) -> float | None:
    """The last XID; 0 while none came on a watched GPU; absent where XIDs are not watched."""
    if last_xid is not None:
        return float(last_xid)
    return 0.0 if r.xid_watched else None


def gpu_labels(r: GpuReading, parents: Mapping[str, GpuReading], host: str, driver: str | None) -> Labels:
    """dcgm-exporter's labels of one GPU or MIG instance (empty values are left out when rendered)."""
    parent = parents.get(r.mig_parent) if r.mig_parent is not None else None
    if parent is not None and r.mig_gi_id is not None:
        labels = {"gpu": str(parent.index), "UUID": parent.uuid, "pci_bus_id": parent.pci_bus_id or "",
                  "device": f"nvidia{parent.index}", "modelName": parent.model or "",
                  "GPU_I_PROFILE": r.mig_profile or "", "GPU_I_ID": str(r.mig_gi_id)}
    else:
        labels = {"gpu": str(r.index), "UUID": r.uuid, "pci_bus_id": r.pci_bus_id or "",
                  "device": f"nvidia{r.index}", "modelName": r.model or ""}
    labels["Hostname"] = host
    labels["DCGM_FI_DRIVER_VERSION"] = driver or ""
    return labels


def job_map_key(r: GpuReading, parents: Mapping[str, GpuReading]) -> str:
    """The HPC job mapping file name of a GPU (`3`) or MIG instance (`3.1`: GPU, GPU instance id)."""
    parent = parents.get(r.mig_parent) if r.mig_parent is not None else None
    if parent is not None and r.mig_gi_id is not None:
        return f"{parent.index}.{r.mig_gi_id}"
    return str(r.index)


def pod_labels(held: HeldProcess) -> Labels:
    """`pod`, `namespace`, `container` of a process in a pod; empty otherwise."""
    pod = held.ident.pod
    if not pod:
        return {}
    namespace, _, name = pod.partition("/")
    return {"pod": name, "namespace": namespace, "container": held.ident.container or ""}


def attribution_labels(procs: Iterable[HeldProcess], jobs: Sequence[str] = ()) -> list[Labels]:
    """One label set per (pod, Slurm job) on the GPU; `[{}]` when neither is known."""
    pods: list[Labels] = []
    found_jobs: list[str] = list(jobs)
    for h in procs:
        p = pod_labels(h)
        if p and p not in pods:
            pods.append(p)
        job = h.ident.job
        if job and job not in found_jobs:
            found_jobs.append(job)
    job_sets: list[Labels] = [{"hpc_job": j} for j in found_jobs]
    return [{**a, **b} for a, b in itertools.product(pods or [{}], job_sets or [{}])]
