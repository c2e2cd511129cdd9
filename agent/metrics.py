"""The agent's Prometheus endpoint: dcgm-exporter's metric names and labels, plus bounded per-process series."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.core import NodeCore

log = logging.getLogger(__name__)

#: the labels dcgm-exporter puts on every GPU series, so its Grafana dashboards work unchanged
DCGM_LABELS = ["gpu", "UUID", "device", "modelName", "Hostname"]
PROCESS_LABELS = ["Hostname", "gpu", "pid", "user", "name"]
#: per-process series per node, the largest GPU memory first; the rest are summed in one series
MAX_PROCESS_SERIES = 32


@dataclass
class AgentCounters:
    """Counters the shell bumps; read at scrape time."""

    samples: int = 0
    sample_errors: int = 0
    events: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # helper task -> times it was started again

    def count_event(self, type_: str) -> None:
        self.events[type_] = self.events.get(type_, 0) + 1


class AgentCollector(Collector):
    """Builds every series from the agents' latest state when scraped: nothing is paid per sample."""

    def __init__(self, cores: Callable[[], Iterable[NodeCore]], counters: AgentCounters,
                 max_process_series: int = MAX_PROCESS_SERIES) -> None:
        self.cores = cores
        self.counters = counters
        self.max_process_series = max_process_series

    def collect(self) -> Iterator[Metric]:
        util = GaugeMetricFamily("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels=DCGM_LABELS)
        fb_used = GaugeMetricFamily("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels=DCGM_LABELS)
        fb_free = GaugeMetricFamily("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels=DCGM_LABELS)
        temp = GaugeMetricFamily("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", labels=DCGM_LABELS)
        power = GaugeMetricFamily("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", labels=DCGM_LABELS)
        limit = GaugeMetricFamily("gpuevents_gpu_power_limit_watts", "Enforced power limit (in W).", labels=DCGM_LABELS)
        idle = GaugeMetricFamily("gpuevents_gpu_idle", "1 while the agent's idle threshold holds.", labels=DCGM_LABELS)
        idle_s = GaugeMetricFamily("gpuevents_gpu_idle_seconds", "Seconds since the GPU became idle.",
                                   labels=DCGM_LABELS)
        lost = GaugeMetricFamily("gpuevents_gpu_lost", "1 when NVML reports the GPU lost.", labels=DCGM_LABELS)
        pmem = GaugeMetricFamily("gpuevents_process_gpu_memory_mib", "GPU memory held by a process (in MiB).",
                                 labels=PROCESS_LABELS)
        putil = GaugeMetricFamily("gpuevents_process_sm_util_pct", "SM utilization of a process (in %).",
                                  labels=PROCESS_LABELS)
        nproc = GaugeMetricFamily("gpuevents_gpu_processes", "Processes holding the GPU.", labels=DCGM_LABELS)
        for core in self.cores():
            now = core.now
            host = core.hostname or core.node
            for i, r in sorted(core.readings.items()):
                lv = [str(i), r.uuid, f"nvidia{i}", r.model or "", host]
                st = core.gpu_states.get(i)
                _add(util, lv, r.util_pct)
                _add(fb_used, lv, r.mem_used_mib)
                free = (r.mem_total_mib - r.mem_used_mib
                        if r.mem_total_mib is not None and r.mem_used_mib is not None else None)
                _add(fb_free, lv, free)
                _add(temp, lv, r.temp_c)
                _add(power, lv, r.power_w)
                _add(limit, lv, r.power_limit_w)
                _add(lost, lv, 1.0 if r.lost else 0.0)
                if st is not None:
                    _add(idle, lv, 1.0 if st.idle else 0.0)
                    since = st.idle_since
                    _add(idle_s, lv, (now - since).total_seconds() if since and now else 0.0)
                _add(nproc, lv, float(len(core.processes_on(i))))
            held = sorted(core.held.values(), key=lambda h: -(h.mem_mib or 0.0))
            for h in held[: self.max_process_series]:
                gpu = ",".join(map(str, h.gpus))
                lv = [host, gpu, str(h.ident.pid), h.ident.user or "", h.ident.name]
                _add(pmem, lv, h.mem_mib)
                _add(putil, lv, h.util_pct)
            rest = held[self.max_process_series:]
            if rest:
                _add(pmem, [host, "", "other", "", "other"], sum(h.mem_mib or 0.0 for h in rest))
        yield from (util, fb_used, fb_free, temp, power, limit, idle, idle_s, lost, nproc, pmem, putil)
        samples = CounterMetricFamily("gpuevents_agent_samples", "Samples taken.")
        samples.add_metric([], self.counters.samples)
        errors = CounterMetricFamily("gpuevents_agent_sample_errors", "Samples that failed.")
        errors.add_metric([], self.counters.sample_errors)
        events = CounterMetricFamily("gpuevents_agent_events", "Events published, by type.", labels=["type"])
        for t, n in sorted(self.counters.events.items()):
            events.add_metric([t], n)
        yield from (samples, errors, events)


def _add(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    if value is not None:
        family.add_metric(labels, value)


class MetricsServer:
    """`/metrics` on a port, from a dedicated registry (no process or platform collectors mixed in)."""

    def __init__(self, collector: AgentCollector, port: int, addr: str = "0.0.0.0") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.addr = addr
        self.requested_port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_port) if self._server is not None else self.requested_port

    def start(self) -> MetricsServer:
        self._server, self._thread = start_http_server(self.requested_port, self.addr, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", self.addr, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
