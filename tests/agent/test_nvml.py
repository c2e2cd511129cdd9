"""The NVML sampler against a stand-in pynvml: fields, unsupported queries, a lost GPU, per-process SM, XIDs, MIG."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pynvml
import pytest

from agent.nvml import NvmlSampler
from agent.nvmlcalls import NvmlUnavailable
from agent.runner import NodeAgent
from agent.sample import ProcessIdentity
from gpuevents.config import Config
from gpuevents.events import GpuEvent
from tests.agent.fake_pynvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_SUPPORTED,
    FakeDevice,
    FakeNvml,
)

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
US = int(NOW.timestamp() * 1_000_000)  # NVML's per-process sample timestamps are µs since the epoch


class NoPsutil:
    """Identities without touching /proc, for pids that are not real."""

    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        return {p: ProcessIdentity(pid=p, create_time=NOW, name="python", user="alice")
                for p in pids}


def sampler(devices: list[FakeDevice], **kw: object) -> tuple[NvmlSampler, FakeNvml]:
    nv = FakeNvml(devices, **kw)  # type: ignore[arg-type]  # keyword overrides
    return NvmlSampler(nv, identifier=NoPsutil()), nv


def test_stand_in_uses_the_real_error_codes() -> None:
    for name in ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_NOT_FOUND",
                 "NVML_ERROR_TIMEOUT", "NVML_ERROR_NO_PERMISSION", "NVML_TEMPERATURE_GPU",
                 "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC", "NVML_DEVICE_MIG_ENABLE",
                 "nvmlEventTypeXidCriticalError"):
        assert getattr(FakeNvml([]), name) == getattr(pynvml, name), name
    for fn in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetProcessUtilization", "nvmlEventSetWait",
               "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMigDeviceHandleByIndex"):
        assert hasattr(pynvml, fn) and hasattr(FakeNvml([]), fn), fn


def test_reads_every_field() -> None:
    dev = FakeDevice(uuid="GPU-abc", util=42, mem_used_mib=20480, mem_total_mib=81920, temp=61,
                     power_mw=312_500, limit_mw=700_000, fan=55, ecc=2,
                     compute=[(100, 20000)], graphics=[(101, 10)],
                     proc_util=[(100, US - 2_000_000, 30), (100, US - 1_000_000, 40)])
    s, _ = sampler([dev])
    assert s.driver_version == "550.54.15"
    r = s.sample(NOW)
    (g,) = r.gpus
    assert (g.index, g.uuid, g.model, g.util_pct, g.mem_used_mib, g.mem_total_mib) == (
        0, "GPU-abc", "NVIDIA H100 80GB HBM3", 42.0, 20480.0, 81920.0)
    assert (g.temp_c, g.power_w, g.power_limit_w, g.fan_pct, g.ecc_uncorrected, g.mem_pct) == (
        61.0, 312.5, 700.0, 55.0, 2, 25.0)
    procs = {p.pid: p for p in r.procs}
    assert procs[100].mem_mib == 20000.0 and procs[100].sm_util_pct == 40.0  # the latest sample
    assert procs[101].mem_mib == 10.0 and procs[101].sm_util_pct == 0.0  # no samples: it did nothing


def test_last_seen_timestamp_is_passed_back() -> None:
    dev = FakeDevice(compute=[(100, 1000)], proc_util=[(100, US - 5_000, 10)])
    s, nv = sampler([dev])
    s.sample(NOW)
    dev.proc_util.append((100, US - 1_000, 20))
    assert s.sample(NOW).procs[0].sm_util_pct == 20.0
    s.sample(NOW)
    assert nv.util_timestamps == [0, US - 5_000, US - 1_000]


def test_a_process_without_a_new_sample_keeps_its_value_while_fresh() -> None:
    dev = FakeDevice(compute=[(100, 1000)], proc_util=[(100, US, 70)])
    s, _ = sampler([dev])
    assert s.sample(NOW).procs[0].sm_util_pct == 70.0
    # the driver has not sampled the process again: still busy as far as we know
    assert s.sample(NOW + timedelta(seconds=2)).procs[0].sm_util_pct == 70.0
    assert s.sample(NOW + timedelta(seconds=6)).procs[0].sm_util_pct == 0.0


def test_unsupported_queries_are_null_and_not_asked_again() -> None:
    dev = FakeDevice(fail={"nvmlDeviceGetFanSpeed": NVML_ERROR_NOT_SUPPORTED,
                           "nvmlDeviceGetTotalEccErrors": NVML_ERROR_NOT_SUPPORTED,
                           "nvmlDeviceGetProcessUtilization": NVML_ERROR_NOT_SUPPORTED},
                     compute=[(100, 1000)])
    s, nv = sampler([dev])
    for _ in range(3):
        r = s.sample(NOW)
    assert r.gpus[0].fan_pct is None and r.gpus[0].ecc_uncorrected is None
    assert r.gpus[0].util_pct == 0.0
    assert r.procs[0].sm_util_pct is None  # unsupported: unknown, not zero
    assert nv.calls["nvmlDeviceGetFanSpeed"] == 1 and nv.calls["nvmlDeviceGetUtilizationRates"] == 3
    assert s.errors == []


def test_other_errors_are_null_and_recorded_once() -> None:
    dev = FakeDevice(fail={"nvmlDeviceGetPowerUsage": NVML_ERROR_NO_PERMISSION})
    s, nv = sampler([dev])
    s.sample(NOW)
    r = s.sample(NOW)
    assert r.gpus[0].power_w is None and nv.calls["nvmlDeviceGetPowerUsage"] == 2
    assert len(s.errors) == 1 and "nvmlDeviceGetPowerUsage" in s.errors[0]


def test_lost_gpu_is_an_event_and_the_agent_keeps_sampling() -> None:
    good = FakeDevice(uuid="GPU-good", util=90, compute=[(100, 1000)])
    bad = FakeDevice(uuid="GPU-bad", util=90)
    s, nv = sampler([good, bad])
    agent = NodeAgent(Config(), s, node="n1")
    assert agent.tick(NOW)  # both fine
    bad.fail["nvmlDeviceGetMemoryInfo"] = NVML_ERROR_GPU_IS_LOST
    events = agent.tick(NOW)
    lost = [e for e in events if e.type == "gpu.lost"]
    assert len(lost) == 1 and isinstance(lost[0], GpuEvent)
    assert lost[0].data.uuid == "GPU-bad" and lost[0].data.lost
    calls = nv.calls["nvmlDeviceGetUtilizationRates"]
    for _ in range(3):
        events = agent.tick(NOW)
        assert not [e for e in events if e.type == "gpu.lost"]
    # the lost GPU is not asked again; the good one still is
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == calls + 3
    snap = agent.core.snapshot(NOW)
    assert [g.lost for g in snap.gpus] == [False, True]
    assert snap.gpus[1].util_pct is None and snap.processes[0].pid == 100


def test_xid_errors_from_the_event_set() -> None:
    a, b = FakeDevice(uuid="GPU-a"), FakeDevice(uuid="GPU-b")
    s, nv = sampler([a, b])
    assert s.sample(NOW).xids == ()
    nv.pending_xids += [(b, 79), (a, 13)]
    xids = s.sample(NOW).xids
    assert [(x.gpu, x.xid) for x in xids] == [(1, 79), (0, 13)]


def test_no_xid_support_means_no_event_set() -> None:
    s, nv = sampler([FakeDevice(events=0)])
    s.sample(NOW)
    assert nv.calls["nvmlEventSetFree"] == 1 and nv.calls["nvmlEventSetWait"] == 0


def test_mig_instances_are_gpus_with_a_parent() -> None:
    mig = [FakeDevice(uuid="MIG-1", name="NVIDIA A100 MIG 3g.40gb", compute=[(200, 5000)],
                      fail={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED}),
           FakeDevice(uuid="MIG-2", name="NVIDIA A100 MIG 3g.40gb")]
    parent = FakeDevice(uuid="GPU-parent", mig=mig,
                        fail={"nvmlDeviceGetUtilizationRates": NVML_ERROR_NOT_SUPPORTED})
    plain = FakeDevice(uuid="GPU-plain")
    s, _ = sampler([parent, plain])
    r = s.sample(NOW)
    assert [(g.index, g.uuid, g.mig_parent) for g in r.gpus] == [
        (0, "GPU-parent", None), (1, "GPU-plain", None), (2, "MIG-1", "GPU-parent"), (3, "MIG-2", "GPU-parent")]
    assert r.gpus[2].util_pct is None
    assert [(p.pid, p.gpu) for p in r.procs] == [(200, 2)]


def test_nvml_that_does_not_load_says_so() -> None:
    with pytest.raises(NvmlUnavailable, match="NVML did not initialise"):
        NvmlSampler(FakeNvml([], init_error=9), identifier=NoPsutil())


def test_close_shuts_nvml_down() -> None:
    s, nv = sampler([FakeDevice()])
    s.close()
    assert nv.calls["nvmlShutdown"] == 1 and nv.calls["nvmlEventSetFree"] == 1


def test_reads_dcgm_exporter_s_default_counters() -> None:
    dev = FakeDevice(sm_clock=1755, mem_clock=2619, mem_temp=47, energy_mj=987_654_321, pcie_replays=3,
                     mem_util=37, enc=12, dec=8, reserved_mib=569, remapped=(2, 1, 0, 1), bus_id="00000000:1A:00.0")
    s, _ = sampler([dev])
    g = s.sample(NOW).gpus[0]
    assert (g.sm_clock_mhz, g.mem_clock_mhz, g.mem_temp_c, g.energy_mj, g.pcie_replays) == (
        1755.0, 2619.0, 47.0, 987_654_321, 3)
    assert (g.mem_copy_util_pct, g.enc_util_pct, g.dec_util_pct, g.mem_reserved_mib) == (37.0, 12.0, 8.0, 569.0)
    assert (g.remapped_rows_correctable, g.remapped_rows_uncorrectable, g.row_remap_failure) == (2, 1, True)
    assert g.pci_bus_id == "00000000:1A:00.0" and g.xid_watched


def test_a_counter_the_gpu_lacks_is_null_and_not_asked_again() -> None:
    dev = FakeDevice(mem_temp=None, fail={"nvmlDeviceGetRemappedRows": NVML_ERROR_NOT_SUPPORTED,
                                          "nvmlDeviceGetClockInfo": NVML_ERROR_NOT_SUPPORTED})
    s, nv = sampler([dev])
    for _ in range(12):
        g = s.sample(NOW).gpus[0]
    assert g.mem_temp_c is None and g.remapped_rows_correctable is None and g.row_remap_failure is None
    assert g.sm_clock_mhz is None and g.mem_clock_mhz is None
    assert nv.calls["nvmlDeviceGetFieldValues"] == 1 and nv.calls["nvmlDeviceGetRemappedRows"] == 1
    assert nv.calls["nvmlDeviceGetClockInfo"] == 2  # SM and MEM each asked once
    assert s.errors == []


def test_rarely_moving_counters_are_read_every_tenth_sample() -> None:
    dev = FakeDevice(pcie_replays=1)
    s, nv = sampler([dev])
    s.sample(NOW)
    dev.pcie_replays = 5
    assert [s.sample(NOW).gpus[0].pcie_replays for _ in range(10)] == [1] * 9 + [5]
    assert nv.calls["nvmlDeviceGetPcieReplayCounter"] == 2


def test_memory_info_falls_back_to_v1_where_the_driver_lacks_v2() -> None:
    no_v2 = {"nvmlDeviceGetMemoryInfo_v2": NVML_ERROR_FUNCTION_NOT_FOUND}
    s, _ = sampler([FakeDevice(mem_used_mib=100, fail=no_v2)])
    s.sample(NOW)
    g = s.sample(NOW).gpus[0]
    assert g.mem_used_mib == 100.0 and g.mem_reserved_mib is None and s.errors == []


def test_xids_are_not_watched_where_events_are_unsupported() -> None:
    s, _ = sampler([FakeDevice(events=0)])
    assert not s.sample(NOW).gpus[0].xid_watched


def test_a_row_remap_pending_a_reset_reaches_the_snapshot() -> None:
    s, _ = sampler([FakeDevice(uuid="GPU-a", remapped=(0, 1, 1, 0)), FakeDevice(uuid="GPU-b")])
    agent = NodeAgent(Config(), s, node="n1")
    agent.tick(NOW)
    snap = agent.core.snapshot(NOW)
    assert [g.row_remap_pending for g in snap.gpus] == [True, False]
    assert snap.gpus[0].model_dump()["row_remap_pending"] is True


class MpsIdentities:
    """The MPS server runs as root from its own program; its clients are alice's and bob's."""

    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        who = {500: ("nvidia-cuda-mps", "/usr/bin/nvidia-cuda-mps-server", "root"),
               601: ("python", "/usr/bin/python3", "alice"), 602: ("python", "/usr/bin/python3", "bob")}
        return {p: ProcessIdentity(pid=p, create_time=NOW, name=who[p][0], exe=who[p][1], user=who[p][2])
                for p in pids}


def test_an_mps_gpu_is_held_by_its_clients_not_by_the_mps_server() -> None:
    shared = FakeDevice(uuid="GPU-mps", util=60, compute=[(500, 300)], mps=[(601, 4000), (602, 2000)],
                        proc_util=[(601, US - 1_000_000, 45), (602, US - 1_000_000, 15)])
    alone = FakeDevice(uuid="GPU-server-only", compute=[(500, 300)])  # no client seen: the server holds it
    agent = NodeAgent(Config(), NvmlSampler(FakeNvml([shared, alone]), identifier=MpsIdentities()), node="n1")
    agent.tick(NOW)
    snap = agent.core.snapshot(NOW)
    assert (snap.gpus[0].pids, snap.gpus[0].owners) == ([601, 602], ["alice", "bob"])
    assert {p.pid: (p.gpus, p.gpu_util_pct) for p in snap.processes} == {
        500: ([1], 0.0), 601: ([0], 45.0), 602: ([0], 15.0)}
