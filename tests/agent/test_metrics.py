"""The Prometheus endpoint: dcgm-exporter's names, types, help and labels; absent, never zero; pods, jobs, MIG."""

from __future__ import annotations

import csv
import re
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from agent.dcgm import DCGM_FIELDS
from agent.hpcjobs import JobMapping
from agent.inputs import NodeInputs
from agent.metrics import DCGM_LABELS, AgentCollector, AgentCounters, Family, MetricsServer, render
from agent.nvml import NvmlSampler
from agent.runner import NodeAgent, simulated_agents
from gpuevents.config import Config
from tests.agent.fake_pynvml import NVML_ERROR_NOT_SUPPORTED, FakeDevice, FakeNvml
from tests.agent.test_nvml import NoPsutil

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
DCGM_DATA = Path(__file__).with_name("data") / "dcgm-exporter"
#: dcgm-exporter defaults that NVML cannot give: NVLink bandwidth counters (deprecated on Hopper),
#: the vGPU licence (vGPU guests only) and the driver version, which is a label here as there
NOT_FROM_NVML = {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DRIVER_VERSION"}

Series = dict[str, list[tuple[dict[str, str], float]]]
_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> tuple[Series, dict[str, str], dict[str, str]]:
    """(samples by name, TYPE by name, HELP by name) of an exposition, names exactly as written."""
    series: Series = {}
    types: dict[str, str] = {}
    helps: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, typ = line[7:].split(" ", 1)
            types[name] = typ
        elif line.startswith("# HELP "):
            name, doc = line[7:].split(" ", 1)
            helps[name] = doc
        elif line:
            m = _SAMPLE.match(line)
            assert m, line
            series.setdefault(m.group(1), []).append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return series, types, helps


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(r.read().decode())


def default_counters() -> dict[str, tuple[str, str]]:
    """dcgm-exporter's default counters: name -> (type, help)."""
    out = {}
    with (DCGM_DATA / "default-counters.csv").open() as f:
        for row in csv.reader(f):
            if row and not row[0].lstrip().startswith("#"):
                name, typ, doc = (x.strip() for x in (row[0], row[1], ",".join(row[2:])))
                out[name] = (typ, doc)
    return out


def served(agents: list[NodeAgent], counters: AgentCounters | None = None, **kw: object) -> str:
    server = MetricsServer(AgentCollector(lambda: [a.core for a in agents], counters or AgentCounters(),
                                          **kw), 0, "127.0.0.1").start()  # type: ignore[arg-type]  # kw: overrides
    try:
        return scrape_text(server.port)
    finally:
        server.stop()


def ticked(scenario: str, nodes: int = 1, seconds: int = 2) -> list[NodeAgent]:
    agents = simulated_agents(Config(), nodes=nodes, gpus_per_node=8, scenario=scenario, start=T0)
    for s in range(seconds):
        for a in agents:
            a.tick(T0 + timedelta(seconds=s))
    return agents


def test_every_default_counter_nvml_gives_has_dcgm_s_name_type_and_help() -> None:
    series, types, helps = parse(served(ticked("hopper-mig")))
    expected = {k: v for k, v in default_counters().items() if k not in NOT_FROM_NVML}
    assert len(expected) == 23
    for name, (typ, doc) in expected.items():
        assert types.get(name) == typ, name
        assert helps.get(name) == doc, name
        assert series.get(name), f"{name} has no series"
        for labels, _ in series[name]:
            assert set(DCGM_LABELS) <= set(labels), (name, labels)
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total" not in series  # counters keep dcgm's names


def test_values_are_the_readings_and_move_as_the_gpu_does() -> None:
    (agent,) = ticked("hopper-mig")
    series, _, _ = parse(served([agent]))

    def value(name: str, gpu: int) -> float:
        found = [v for lb, v in series[name] if lb["gpu"] == str(gpu) and "GPU_I_ID" not in lb]
        assert len(found) == 1, (name, gpu, found)
        return found[0]

    r = {i: agent.core.readings[i] for i in range(6)}
    busy = max(r, key=lambda i: r[i].util_pct or 0)
    idle = min(r, key=lambda i: r[i].util_pct or 0)
    assert value("DCGM_FI_DEV_GPU_UTIL", busy) == r[busy].util_pct and r[idle].util_pct == 0
    assert value("DCGM_FI_DEV_SM_CLOCK", idle) < value("DCGM_FI_DEV_SM_CLOCK", busy)
    assert value("DCGM_FI_DEV_POWER_USAGE", idle) < value("DCGM_FI_DEV_POWER_USAGE", busy)
    assert value("DCGM_FI_PROF_GR_ENGINE_ACTIVE", busy) == round((r[busy].util_pct or 0) / 100, 6)
    fb = [value(f"DCGM_FI_DEV_FB_{k}", busy) for k in ("USED", "FREE", "RESERVED")]
    assert abs(sum(fb) - (r[busy].mem_total_mib or 0)) < 0.01
    before = value("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", busy)
    agent.tick(T0 + timedelta(seconds=12))
    after = parse(served([agent]))[0]
    energy = [v for lb, v in after["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] if lb["gpu"] == str(busy)]
    assert energy[0] - before >= 10 * 0.9 * (r[busy].power_w or 0) * 1000  # about 10 s at that power, in mJ


def test_a_reading_the_gpu_does_not_give_is_absent_not_zero() -> None:
    dev = FakeDevice(uuid="GPU-a10", name="NVIDIA A10G", mem_temp=None, events=0,
                     fail={"nvmlDeviceGetRemappedRows": NVML_ERROR_NOT_SUPPORTED,
                           "nvmlDeviceGetPcieReplayCounter": NVML_ERROR_NOT_SUPPORTED})
    sampler = NvmlSampler(FakeNvml([dev]), identifier=NoPsutil())
    agent = NodeAgent(Config(), sampler, node="n1", hostname="n1")
    agent.tick(T0)
    agent.tick(T0 + timedelta(seconds=1))
    series, _, _ = parse(served([agent]))
    for name in ("DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
                 "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_PROF_SM_ACTIVE",
                 "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        assert name not in series, name  # no GPM on an A10G, no XID events registered here
    assert series["DCGM_FI_DEV_SM_CLOCK"][0][1] == 1980.0
    assert series["DCGM_FI_DEV_GPU_TEMP"][0][0]["pci_bus_id"] == "00000000:07:00.0"
    assert series["DCGM_FI_DEV_GPU_TEMP"][0][0]["DCGM_FI_DRIVER_VERSION"] == "550.54.15"


def test_xid_errors_are_zero_until_one_comes_then_the_last_one() -> None:
    nv = FakeNvml([FakeDevice(uuid="GPU-0"), FakeDevice(uuid="GPU-1")])
    agent = NodeAgent(Config(), NvmlSampler(nv, identifier=NoPsutil()), node="n1")
    agent.tick(T0)
    assert [v for _, v in parse(served([agent]))[0]["DCGM_FI_DEV_XID_ERRORS"]] == [0.0, 0.0]
    nv.pending_xids += [(nv.devices[1], 48), (nv.devices[1], 79)]
    agent.tick(T0 + timedelta(seconds=1))
    xids = {lb["gpu"]: v for lb, v in parse(served([agent]))[0]["DCGM_FI_DEV_XID_ERRORS"]}
    assert xids == {"0": 0.0, "1": 79.0}


def test_mig_instances_carry_their_gpu_s_labels_and_instance_id() -> None:
    (agent,) = ticked("hopper-mig")
    series, _, _ = parse(served([agent]))
    parent = agent.core.readings[6]
    on_6 = [lb for lb, _ in series["DCGM_FI_DEV_FB_USED"] if lb["gpu"] == "6"]
    instances = sorted((lb["GPU_I_ID"], lb["GPU_I_PROFILE"]) for lb in on_6 if "GPU_I_ID" in lb)
    assert instances == [("1", "3g.40gb"), ("2", "2g.20gb"), ("3", "1g.10gb"), ("4", "1g.10gb")]
    assert all(lb["UUID"] == parent.uuid and lb["device"] == "nvidia6" for lb in on_6)
    assert all(lb["modelName"] == "NVIDIA H100 80GB HBM3" for lb in on_6)
    # a MIG instance has a utilization (from GPM) and activity; its GPU has activity but no utilization
    assert {lb.get("GPU_I_ID") for lb, _ in series["DCGM_FI_DEV_GPU_UTIL"] if lb["gpu"] == "6"} == {
        "1", "2", "3", "4"}
    assert [lb for lb, _ in series["DCGM_FI_PROF_SM_ACTIVE"] if lb["gpu"] == "6" and "GPU_I_ID" not in lb]


def test_gpus_in_pods_and_slurm_jobs_carry_pod_and_hpc_job_labels() -> None:
    (agent,) = ticked("hopper-mig")
    series, _, _ = parse(served([agent]))
    util = series["DCGM_FI_DEV_GPU_UTIL"]
    for i in range(6):
        procs = agent.core.processes_on(i)
        mine = [lb for lb, _ in util if lb["gpu"] == str(i)]
        if not procs:
            assert mine and all("pod" not in lb and "hpc_job" not in lb for lb in mine)
            continue
        ident = procs[0].ident
        namespace, name = (ident.pod or "").split("/")
        assert {(lb["pod"], lb["namespace"], lb["container"], lb["hpc_job"]) for lb in mine} == {
            (name, namespace, ident.container, ident.job)}
    pmem = series["gpuevents_process_gpu_memory_mib"]
    assert all(lb["pod"] and lb["hpc_job"] for lb, _ in pmem)  # per-process series name their pod and job


def test_a_gpu_shared_by_two_pods_has_a_series_for_each() -> None:
    (agent,) = ticked("hopper-mig")
    core = agent.core
    held = [h for h in core.held.values() if 0 in h.gpus]
    other = next(h for h in core.held.values() if 0 not in h.gpus and h.ident.pod)
    core.held[(other.ident.pid, other.ident.create_time)] = type(other)(
        ident=other.ident, gpus=(0,), mem_mib=other.mem_mib, util_pct=other.util_pct)
    series, _, _ = parse(served([agent]))
    pods = {lb["pod"] for lb, _ in series["DCGM_FI_DEV_POWER_USAGE"] if lb["gpu"] == "0"}
    assert pods == {h.ident.pod.split("/")[1] for h in [*held, other] if h.ident.pod}
    assert len(pods) == 2


def test_the_hpc_job_mapping_directory_labels_gpus_and_mig_instances(tmp_path: Path) -> None:
    (tmp_path / "3").write_text("4242\n4243\n")
    (tmp_path / "6.2").write_text("777\n")
    (tmp_path / "notes.txt").write_text("not a GPU\n")
    cfg = Config()
    agents = simulated_agents(cfg, nodes=1, gpus_per_node=8, scenario="steady", start=T0)
    agents[0].tick(T0)
    agents[0].core.inputs = NodeInputs(job_gpus=JobMapping(tmp_path).jobs())  # as the last sample had it
    series, _, _ = parse(served(agents))
    jobs = sorted((lb["gpu"], lb["hpc_job"]) for lb, _ in series["DCGM_FI_DEV_GPU_TEMP"] if "hpc_job" in lb)
    assert jobs == [("3", "4242"), ("3", "4243")]  # steady has no MIG: `6.2` names no device here
    (mig,) = ticked("hopper-mig")
    mig.core.held = {}  # no processes: only the mapping names jobs
    mig.core.inputs = NodeInputs(job_gpus=JobMapping(tmp_path).jobs())
    series, _, _ = parse(served([mig]))
    mig_jobs = sorted((lb["gpu"], lb.get("GPU_I_ID", ""), lb["hpc_job"])
                      for lb, _ in series["DCGM_FI_DEV_FB_USED"] if "hpc_job" in lb)
    assert mig_jobs == [("3", "", "4242"), ("3", "", "4243"), ("6", "2", "777")]
    assert JobMapping(tmp_path / "missing").jobs() == {}


def test_agent_series_and_counters() -> None:
    agents = simulated_agents(Config(), nodes=2, gpus_per_node=8, scenario="steady", start=T0)
    counters = AgentCounters()
    for a in agents:
        for e in a.tick(T0):
            counters.count_event(e.type)
    text = served(agents, counters)
    series, types, _ = parse(text)
    assert len(series["DCGM_FI_DEV_GPU_UTIL"]) == 16
    lb = next(lb for lb, _ in series["DCGM_FI_DEV_GPU_TEMP"] if lb["Hostname"] == "sim-000" and lb["gpu"] == "0")
    assert lb["UUID"] == agents[0].core.readings[0].uuid and lb["device"] == "nvidia0"
    assert len(series["gpuevents_process_gpu_memory_mib"]) == 32  # 16 processes on each node
    assert ({"type": "node.snapshot"}, 2.0) in series["gpuevents_agent_events_total"]
    assert types["gpuevents_agent_events_total"] == "counter"
    assert not [n for n in series if n.startswith(("python_", "process_"))]  # only the agent's own series
    # prometheus_client's own parser reads the whole exposition
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "gpuevents_agent_samples"} <= names


def test_process_series_are_bounded() -> None:
    (agent,) = simulated_agents(Config(), nodes=1, gpus_per_node=8, scenario="steady", start=T0)
    agent.tick(T0)
    collector = AgentCollector(lambda: [agent.core], AgentCounters(), max_process_series=5)
    fams = {f.name: f for f in collector.collect()}
    samples = fams["gpuevents_process_gpu_memory_mib"].samples
    assert len(samples) == 6  # five largest and one "other"
    top = [v for _, v in samples[:5]]
    assert top == sorted(top, reverse=True)
    assert samples[5][0]["pid"] == "other"
    total = sum(h.mem_mib or 0 for h in agent.core.held.values())
    assert abs(sum(v for _, v in samples) - total) < 0.01


def test_label_values_are_escaped_and_empty_ones_left_out() -> None:
    fam = Family("x", "gauge", "a\\b\nc")
    fam.add({"name": 'say "hi"\\\n', "pod": ""}, 1.5)
    fam.add({"name": "none"}, None)
    text = render([fam]).decode()
    assert text == '# HELP x a\\\\b\\nc\n# TYPE x gauge\nx{name="say \\"hi\\"\\\\\\n"} 1.5\n'
    (parsed,) = text_string_to_metric_families(text)
    assert parsed.samples[0].labels == {"name": 'say "hi"\\\n'}


def test_every_field_is_served_once() -> None:
    names = [f.name for f in DCGM_FIELDS]
    assert len(names) == len(set(names))


def test_process_labels_can_be_dropped_leaving_sums_per_gpu() -> None:
    agents = ticked("steady")
    series, _, _ = parse(served(agents, process_labels=False))
    procs = series["gpuevents_process_gpu_memory_mib"]
    assert procs and all(not {"pid", "user", "name"} & lb.keys() for lb, _ in procs)
    assert all(not {"pid", "user", "name"} & lb.keys() for lb, _ in series["gpuevents_process_sm_util_pct"])
    total = sum(h.mem_mib or 0 for h in agents[0].core.held.values())
    assert abs(sum(v for _, v in procs) - total) < 0.01
    named, _, _ = parse(served(agents))  # the default names them
    assert all({"pid", "user", "name"} <= lb.keys() for lb, _ in named["gpuevents_process_gpu_memory_mib"])


def listening_on(port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_the_agents_metrics_listen_where_config_says() -> None:
    config = Config.model_validate({"agent": {"metrics_address": "127.0.0.1"}})
    assert Config().agent.metrics_address == "0.0.0.0"  # the default: reachable for Prometheus
    server = MetricsServer(AgentCollector(lambda: [], AgentCounters()), 0, config.agent.metrics_address).start()
    try:
        assert listening_on(server.port) == {"127.0.0.1"}
    finally:
        server.stop()


def test_the_engines_metrics_listen_where_config_says() -> None:
    from prometheus_client import CollectorRegistry

    from gpuevents.cli.parts import start_metrics
    from gpuevents.server import free_port

    config = Config.model_validate({"engine": {"metrics_address": "127.0.0.1", "metrics_port": free_port()}})
    assert Config().engine.metrics_address == "0.0.0.0"
    port = config.engine.metrics_port
    assert port is not None
    server = start_metrics(port, CollectorRegistry(), config.engine.metrics_address)
    try:
        assert listening_on(port) == {"127.0.0.1"}
    finally:
        server.shutdown()
        server.server_close()
