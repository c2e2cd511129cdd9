"""The agent's Prometheus endpoint: dcgm-exporter's series (agent/dcgm.py), the agent's own, bounded per-process ones.

The text is rendered here rather than by prometheus_client, whose exposition renames every counter
`<name>_total`: dcgm-exporter's counters (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`) keep their names.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.utils import floatToGoString

from agent.core import HeldProcess, NodeCore
from agent.dcgm import (
    DCGM_FIELDS,
    DCGM_LABELS,
    XID_FIELD,
    Labels,
    attribution_labels,
    gpu_labels,
    job_map_key,
    pod_labels,
    xid_value,
)

__all__ = ["DCGM_LABELS", "MAX_PROCESS_SERIES", "AgentCollector", "AgentCounters", "Family", "MetricsServer",
           "render"]

log = logging.getLogger(__name__)

PROCESS_LABELS = ["Hostname", "gpu", "pid", "user", "name"]
#: per-process series per node, the largest GPU memory first; the rest are summed in one series
MAX_PROCESS_SERIES = 32
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class AgentCounters:
    """Counters the shell bumps; read at scrape time."""

    samples: int = 0
    sample_errors: int = 0
    job_detail_failures: int = 0  # Slurm job details that could not be read (agent/jobdetails.py)
    events: dict[str, int] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # helper task -> times it was started again

    def count_event(self, type_: str) -> None:
        self.events[type_] = self.events.get(type_, 0) + 1


@dataclass
class Family:
    """One metric: its name, type and help, and its samples (label set, value)."""

    name: str
    type: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def add(self, labels: Labels, value: float | None) -> None:
        if value is not None:  # a reading the hardware did not give is an absent sample, never a zero
            self.samples.append((labels, float(value)))


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(families: Iterable[Family]) -> bytes:
    """The Prometheus text format (0.0.4); labels with empty values are left out, as Prometheus reads them."""
    out: list[str] = []
    for f in families:
        if not f.samples:
            continue
        out.append(f"# HELP {f.name} {f.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}")
        out.append(f"# TYPE {f.name} {f.type}")
        for labels, value in f.samples:
            pairs = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items() if v != "")
            out.append(f"{f.name}{{{pairs}}} {floatToGoString(value)}" if pairs
                       else f"{f.name} {floatToGoString(value)}")
    out.append("")
    return "\n".join(out).encode()


class AgentCollector:
    """Builds every series from the agents' latest state when scraped: nothing is paid per sample."""

    def __init__(self, cores: Callable[[], Iterable[NodeCore]], counters: AgentCounters,
                 max_process_series: int = MAX_PROCESS_SERIES, *, process_labels: bool = True) -> None:
        self.cores = cores
        self.counters = counters
        self.max_process_series = max_process_series
        self.process_labels = process_labels

    def collect(self) -> Iterator[Family]:
        dcgm = [Family(f.name, f.type, f.help) for f in DCGM_FIELDS]
        xid = Family(XID_FIELD.name, XID_FIELD.type, XID_FIELD.help)
        limit = Family("gpuevents_gpu_power_limit_watts", "gauge", "Enforced power limit (in W).")
        idle = Family("gpuevents_gpu_idle", "gauge", "1 while the agent's idle threshold holds.")
        idle_s = Family("gpuevents_gpu_idle_seconds", "gauge", "Seconds since the GPU became idle.")
        lost = Family("gpuevents_gpu_lost", "gauge", "1 when NVML reports the GPU lost.")
        nproc = Family("gpuevents_gpu_processes", "gauge", "Processes holding the GPU.")
        pmem = Family("gpuevents_process_gpu_memory_mib", "gauge", "GPU memory held by a process (in MiB).")
        putil = Family("gpuevents_process_sm_util_pct", "gauge", "SM utilization of a process (in %).")
        for core in self.cores():
            # the HPC job mapping as the sampling loop last read it (NodeCore.job_gpus): read once, in one place
            self._node(core, core.inputs.job_gpus or {}, dcgm, xid, [limit, idle, idle_s, lost, nproc], pmem, putil)
        yield from (*dcgm, xid, limit, idle, idle_s, lost, nproc, pmem, putil)
        samples = Family("gpuevents_agent_samples_total", "counter", "Samples taken.")
        samples.add({}, self.counters.samples)
        errors = Family("gpuevents_agent_sample_errors_total", "counter", "Samples that failed.")
        errors.add({}, self.counters.sample_errors)
        details = Family("gpuevents_agent_job_detail_failures_total", "counter",
                         "Slurm job details that could not be read (squeue missing, slow or garbled).")
        details.add({}, self.counters.job_detail_failures)
        events = Family("gpuevents_agent_events_total", "counter", "Events published, by type.")
        for t, n in sorted(self.counters.events.items()):
            events.add({"type": t}, n)
        yield from (samples, errors, details, events)

    def _node(self, core: NodeCore, job_map: Mapping[str, list[str]], dcgm: list[Family], xid: Family,
              own: list[Family], pmem: Family, putil: Family) -> None:
        limit, idle, idle_s, lost, nproc = own
        now = core.now
        host = core.hostname or core.node
        readings = dict(core.readings)
        parents = {r.uuid: r for r in readings.values() if r.mig_parent is None}
        for i, r in sorted(readings.items()):
            base = gpu_labels(r, parents, host, core.driver_version)
            on_gpu = core.processes_on(i)
            for extra in attribution_labels(on_gpu, job_map.get(job_map_key(r, parents), ())):
                lv = {**base, **extra}
                for fam, spec in zip(dcgm, DCGM_FIELDS, strict=True):
                    fam.add(lv, spec.value(r))
                xid.add(lv, xid_value(r, core.last_xid.get(i)))
            st = core.gpu_states.get(i)
            limit.add(base, r.power_limit_w)
            lost.add(base, 1.0 if r.lost else 0.0)
            if st is not None:
                idle.add(base, 1.0 if st.idle else 0.0)
                since = st.idle_since
                idle_s.add(base, (now - since).total_seconds() if since and now else 0.0)
            nproc.add(base, float(len(on_gpu)))
        held = sorted(core.held.values(), key=lambda h: -(h.mem_mib or 0.0))
        if not self.process_labels:
            _anonymous(host, held, pmem, putil)
            return
        for h in held[: self.max_process_series]:
            lv = {"Hostname": host, "gpu": ",".join(map(str, h.gpus)), "pid": str(h.ident.pid),
                  "user": h.ident.user or "", "name": h.ident.name, **pod_labels(h),
                  "hpc_job": h.ident.job or ""}
            pmem.add(lv, h.mem_mib)
            putil.add(lv, h.util_pct)
        rest = held[self.max_process_series:]
        if rest:
            pmem.add({"Hostname": host, "gpu": "", "pid": "other", "user": "", "name": "other"},
                     sum(h.mem_mib or 0.0 for h in rest))

    def render(self) -> bytes:
        return render(self.collect())


def _anonymous(host: str, held: list[HeldProcess], pmem: Family, putil: Family) -> None:
    """The per-process series without pid, user or name (`agent.metrics_process_labels: false`): summed per
    GPU and pod or job, which is what a scrape may still tell."""
    sums: dict[tuple[tuple[str, str], ...], list[float]] = {}
    for h in held:
        lv = {"Hostname": host, "gpu": ",".join(map(str, h.gpus)), **pod_labels(h), "hpc_job": h.ident.job or ""}
        acc = sums.setdefault(tuple(lv.items()), [0.0, 0.0])
        acc[0] += h.mem_mib or 0.0
        acc[1] += h.util_pct or 0.0
    for key, (mem, util) in sums.items():
        pmem.add(dict(key), mem)
        putil.add(dict(key), util)


class _Handler(BaseHTTPRequestHandler):
    collector: AgentCollector

    def do_GET(self) -> None:  # http.server's name for it
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics here")
            return
        try:
            body = self.collector.render()
        except Exception:  # a scrape must never take the agent down; say so and answer 500
            log.exception("building /metrics failed")
            self.send_error(500, "building the metrics failed; see the agent's log")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None  # scrapes every few seconds are not news


class MetricsServer:
    """`/metrics` on a port, in a daemon thread; only the agent's own series (no process or platform ones)."""

    def __init__(self, collector: AgentCollector, port: int, addr: str = "0.0.0.0") -> None:
        self.collector = collector
        self.addr = addr
        self.requested_port = port
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_port) if self._server is not None else self.requested_port

    def start(self) -> MetricsServer:
        handler = type("MetricsHandler", (_Handler,), {"collector": self.collector})
        self._server = ThreadingHTTPServer((self.addr, self.requested_port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="agent-metrics", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.addr, self.port)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
