"""A real Prometheus scraping simulated agents: NVIDIA's dcgm-exporter Grafana board works on gpuevents unchanged,
and what Prometheus stores has dcgm-exporter's names, types and labels."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agent.dcgm import DCGM_LABELS
from agent.metrics import AgentCollector, AgentCounters, MetricsServer
from agent.runner import NodeAgent, simulated_agents
from gpuevents.config import Config
from tests.agent.test_metrics import NOT_FROM_NVML, default_counters
from tests.prometheus import PrometheusServer

pytestmark = pytest.mark.slow  # a real Prometheus scrapes simulated agents

BOARD = Path(__file__).with_name("data") / "dcgm-exporter" / "dcgm-exporter-dashboard.json"
JOB = "dcgm"
TICK_S = 0.5


@dataclass
class Fleet:
    agents: list[NodeAgent]
    prometheus: PrometheusServer


def board_targets(path: Path) -> list[tuple[str, str, str]]:
    """(panel title, expr, legendFormat) of every query on a Grafana board, rows' panels included."""
    board = json.loads(path.read_text())
    out = []
    for panel in board["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for t in p.get("targets", []):
                out.append((p.get("title", ""), t["expr"], t.get("legendFormat", "")))
    return out


def grafana_variables(expr: str, values: dict[str, str]) -> str:
    """The query as Grafana sends it, with every `$variable` given a value."""
    out = re.sub(r"\$(\w+)", lambda m: values[m.group(1)], expr)
    assert "$" not in out, out
    return out


def _tick_until(agents: list[NodeAgent], stop: threading.Event) -> None:
    while not stop.is_set():
        now = datetime.now(UTC)
        for a in agents:
            a.tick(now)
        stop.wait(TICK_S)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two simulated Hopper nodes (MIG on GPUs 6 and 7, pods, Slurm jobs) sampled every 0.5 s, their /metrics
    scraped every second by Prometheus."""
    agents = simulated_agents(Config(), nodes=2, gpus_per_node=8, scenario="hopper-mig", start=datetime.now(UTC))
    stop = threading.Event()
    for a in agents:
        a.tick(datetime.now(UTC))
    ticker = threading.Thread(target=_tick_until, args=(agents, stop), daemon=True)
    ticker.start()
    server = MetricsServer(AgentCollector(lambda: [a.core for a in agents], AgentCounters()), 0,
                           "127.0.0.1").start()
    try:
        with PrometheusServer.running(tmp_path_factory.mktemp("prometheus"),
                                      {JOB: [f"127.0.0.1:{server.port}"]}) as prom:
            prom.wait_until(lambda: prom.scrapes(JOB) >= 4, "four scrapes of the agent")
            yield Fleet(agents, prom)
    finally:
        stop.set()
        ticker.join(5)
        server.stop()


def _labels(result: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [r["metric"] for r in result]


def test_every_panel_of_nvidia_s_board_has_series_with_their_labels(fleet: Fleet) -> None:
    prom = fleet.prometheus
    targets = board_targets(BOARD)
    assert len(targets) == 8
    for variable in ("instance", "gpu"):  # the board's template variables: label_values(GPU_TEMP, ...)
        assert prom.api(f"label/{variable}/values", **{"match[]": "DCGM_FI_DEV_GPU_TEMP"})
    gpus = {str(i) for i in range(8)}
    for title, expr, legend in targets:
        result = prom.query(grafana_variables(expr, {"instance": ".+", "gpu": ".+"}))
        assert result, f"panel {title!r}: {expr} returned nothing"
        wanted = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", legend))
        for labels in _labels(result):
            assert wanted <= set(labels), (title, labels)
        if not expr.startswith(("avg(", "sum(")):  # per-GPU panels: dcgm's labels on every series
            for labels in _labels(result):
                assert set(DCGM_LABELS) | {"instance", "job"} <= set(labels), (title, labels)
            hosts = {(lb["Hostname"], lb["gpu"]) for lb in _labels(result)}
            assert hosts >= {(f"sim-00{n}", g) for n in range(2) for g in gpus}, (title, sorted(hosts))
    sm_clock = prom.query('DCGM_FI_DEV_SM_CLOCK{instance=~".+", gpu=~".+"} * 1000000')
    assert all(345e6 <= float(r["value"][1]) <= 1980e6 for r in sm_clock)  # MHz on the board's Hz axis


def test_prometheus_reads_dcgm_s_types_for_every_default_counter(fleet: Fleet) -> None:
    metadata = fleet.prometheus.api("metadata")
    for name, (typ, doc) in default_counters().items():
        if name in NOT_FROM_NVML:
            continue
        assert name in metadata, f"Prometheus has no {name}"
        assert metadata[name][0]["type"] == typ and metadata[name][0]["help"] == doc, (name, metadata[name])


def test_energy_is_a_counter_whose_rate_is_the_power(fleet: Fleet) -> None:
    prom = fleet.prometheus
    # the same label sets on both sides: each GPU's energy rate over its power draw
    result = prom.query("irate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m]) / 1000 / DCGM_FI_DEV_POWER_USAGE")
    ratios = [float(r["value"][1]) for r in result]
    assert len({(r["metric"]["Hostname"], r["metric"]["gpu"]) for r in result}) == 16  # every physical GPU
    # mJ/s ÷ 1000 is watts: about 1, the load moving between scrapes aside (a unit slip is a factor 1000)
    assert all(0.1 < x < 10 for x in ratios), ratios


def test_pods_jobs_and_mig_instances_are_labelled_as_dcgm_exporter_labels_them(fleet: Fleet) -> None:
    prom = fleet.prometheus
    in_pods = _labels(prom.query('DCGM_FI_DEV_FB_USED{pod!=""}'))
    assert in_pods and all(lb["namespace"] == "ml" and lb["container"] and lb["hpc_job"] for lb in in_pods)
    cores = {a.node: a.core for a in fleet.agents}
    held_gpus = {(node, str(i)) for node, c in cores.items() for i in range(6) if c.processes_on(i)}
    assert {(lb["Hostname"], lb["gpu"]) for lb in in_pods if "GPU_I_ID" not in lb} <= held_gpus
    mig = _labels(prom.query('DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}'))
    assert {(lb["gpu"], lb["GPU_I_ID"], lb["GPU_I_PROFILE"]) for lb in mig} >= {
        ("6", "1", "3g.40gb"), ("7", "4", "1g.10gb")}
    # the MIG instances' utilization, for the boards that need one: the board's GPU_UTIL panel shows them
    instances = sum(1 for a in fleet.agents for r in a.core.readings.values() if r.mig_parent is not None)
    assert instances == 16
    assert prom.query('count(count by (Hostname, gpu, GPU_I_ID) (DCGM_FI_DEV_GPU_UTIL{GPU_I_ID!=""}))')[0][
        "value"][1] == str(instances)
    # what a user asks for: the GPUs whose SMs idle while NVML's utilization says busy
    spinning = prom.query('DCGM_FI_DEV_GPU_UTIL{GPU_I_ID=""} > 90 and on (instance, Hostname, gpu) '
                          'DCGM_FI_PROF_SM_ACTIVE{GPU_I_ID=""} < 0.05')
    expected = {(a.node, str(i)) for a in fleet.agents for i, r in a.core.readings.items()
                if r.mig_parent is None and (r.util_pct or 0) > 90 and (r.sm_active_pct or 0) < 5}
    assert {(lb["Hostname"], lb["gpu"]) for lb in _labels(spinning)} == expected
