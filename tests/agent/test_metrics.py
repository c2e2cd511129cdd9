"""The Prometheus endpoint: dcgm-exporter's names and labels, bounded per-process series."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import DCGM_LABELS, AgentCollector, AgentCounters, MetricsServer
from agent.runner import simulated_agents
from gpuevents.config import Config

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_dcgm_names_and_labels() -> None:
    agents = simulated_agents(Config(), nodes=2, gpus_per_node=8, scenario="steady", start=T0)
    counters = AgentCounters()
    for a in agents:
        for e in a.tick(T0):
            counters.count_event(e.type)
    server = MetricsServer(AgentCollector(lambda: [a.core for a in agents], counters), 0, "127.0.0.1").start()
    try:
        m = scrape(server.port)
    finally:
        server.stop()
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                 "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"):
        assert len(m[name]) == 16, name
        labels, _ = m[name][0]
        assert set(DCGM_LABELS) <= set(labels)
    util = {(lb["Hostname"], lb["gpu"]): v for lb, v in m["DCGM_FI_DEV_GPU_UTIL"]}
    core = agents[1].core
    r = core.readings[3]
    assert util[("sim-001", "3")] == r.util_pct
    used = {(lb["Hostname"], lb["gpu"]): v for lb, v in m["DCGM_FI_DEV_FB_USED"]}
    free = {(lb["Hostname"], lb["gpu"]): v for lb, v in m["DCGM_FI_DEV_FB_FREE"]}
    assert used[("sim-001", "3")] + free[("sim-001", "3")] == r.mem_total_mib
    lb = next(lb for lb, _ in m["DCGM_FI_DEV_GPU_TEMP"] if lb["Hostname"] == "sim-000" and lb["gpu"] == "0")
    assert lb["UUID"] == agents[0].core.readings[0].uuid and lb["modelName"] == "NVIDIA H100 80GB HBM3"
    assert lb["device"] == "nvidia0"
    assert len(m["gpuevents_process_gpu_memory_mib"]) == 32  # 16 processes on each node
    assert ({"type": "node.snapshot"}, 2.0) in m["gpuevents_agent_events_total"]
    # a dedicated registry: no python_gc_* or process_* series mixed in
    assert not [n for n in m if n.startswith(("python_", "process_"))]


def test_process_series_are_bounded() -> None:
    (agent,) = simulated_agents(Config(), nodes=1, gpus_per_node=8, scenario="steady", start=T0)
    agent.tick(T0)
    collector = AgentCollector(lambda: [agent.core], AgentCounters(), max_process_series=5)
    fams = {f.name: f for f in collector.collect()}
    samples = fams["gpuevents_process_gpu_memory_mib"].samples
    assert len(samples) == 6  # five largest and one "other"
    top = [s.value for s in samples[:5]]
    assert top == sorted(top, reverse=True)
    assert samples[5].labels["pid"] == "other"
    total = sum(h.mem_mib or 0 for h in agent.core.held.values())
    assert abs(sum(s.value for s in samples) - total) < 0.01
