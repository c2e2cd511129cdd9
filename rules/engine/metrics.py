"""The engine's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gpuevents.kvstate import KINDS, UNREADABLE
from rules.engine.read import readings

if TYPE_CHECKING:
    from rules.core.core import Core


class _KvUnreadable(Collector):
    """gpuevents_kv_unreadable_total: values in KV read as absent and repaired (gpuevents.kvstate), by kind."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("gpuevents_kv_unreadable", "Unreadable KV values read as absent and repaired, "
                                     "by kind of key", labels=["kind"])
        for kind in KINDS:
            family.add_metric([kind], UNREADABLE.counts.get(kind, 0))
        yield family


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.events = Counter("gpuevents_events_consumed_total", "Events consumed, by type",
                              ["type"], registry=r)
        self.malformed = Counter("gpuevents_events_malformed_total",
                                 "Malformed events sent to the dead-letter queue, by kind", ["kind"],
                                 registry=r)
        self.eval_errors = Counter("gpuevents_evaluation_errors_total",
                                   "Condition evaluations that raised (counted as false), by rule",
                                   ["rule"], registry=r)
        self.incidents = Gauge("gpuevents_incidents", "Incidents by state", ["state"], registry=r)
        self.actions = Counter("gpuevents_actions_total",
                               "Action requests by type and decision or outcome",
                               ["type", "outcome"], registry=r)
        self.latency = Histogram(
            "gpuevents_event_to_action_seconds",
            "From an event's time to the dispatch of the action it caused",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.bus_retries = Counter("gpuevents_engine_bus_retries_total",
                                   "Commits or dead-letter writes retried because NATS did not take them",
                                   registry=r)
        self.reloads = Counter("gpuevents_rule_reloads_total", "Rule reloads by result", ["result"],
                               registry=r)
        self.leader = Gauge("gpuevents_engine_leader", "1 while this engine holds the lease",
                            registry=r)
        self.held_idle = Gauge("gpuevents_held_idle_gpus",
                               "GPUs idle while a process, an owner or a scheduler's allocation holds them", registry=r)
        self.waste = Counter("gpuevents_waste_cost",
                             "Estimated money spent on idle GPUs, by kind (held_idle, unallocated)",
                             ["kind"], registry=r)
        self.gpus = Gauge("gpuevents_gpus", "GPUs known to the engine", registry=r)
        self.clock_skew = Counter("gpuevents_clock_skew_events_total",
                                  "Events whose agent clock was over engine.max_clock_skew off the server's",
                                  registry=r)
        self.node_claim_conflicts = Counter(
            "gpuevents_node_claim_conflicts_total",
            "Times two or more agents were found taking turns on one node name (each set counted once)",
            ["node"], registry=r)
        self.nodes_online = Gauge("gpuevents_nodes_online", "Nodes with a recent snapshot",
                                  registry=r)
        self.exemptions = Gauge("gpuevents_job_exemptions",
                                "Jobs' gpuevents.io/keep-until and exclude annotations: in force, or malformed "
                                "(not applied)", ["state"], registry=r)
        self.clock_offset = Gauge("gpuevents_engine_clock_offset_seconds",
                                  "This engine's clock minus the NATS server's (beyond engine.max_clock_offset it "
                                  "does not lead)", registry=r)
        self.degraded = Gauge("gpuevents_engine_degraded",
                              "1 while JetStream refuses the engine's writes for lack of room", registry=r)
        self.store_full = Counter("gpuevents_store_full_total",
                                  "Engine writes JetStream refused for lack of room (retried)", registry=r)
        r.register(_KvUnreadable())

    def observe_fleet(self, core: Core) -> None:
        """Set the gauges that count the fleet and its incidents (on every tick)."""
        counts = {"pending": 0, "firing": 0}
        for inc in core.open_incidents():
            counts[inc.status] = counts.get(inc.status, 0) + 1
        for state, n in counts.items():
            self.incidents.labels(state=state).set(n)
        gpus = core.gpus()
        self.gpus.set(len(gpus))
        self.held_idle.set(readings.held_idle_count(core))
        self.nodes_online.set(sum(1 for n in core.nodes() if n.online))
        ex = core.state.jobs.exemptions
        self.exemptions.labels(state="active").set(sum(len(v) for v in ex.active.values()))
        self.exemptions.labels(state="malformed").set(sum(len(v) for v in ex.malformed.values()))
