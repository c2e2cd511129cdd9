"""The engine's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
                               "GPUs idle while a process holds them", registry=r)
        self.waste = Counter("gpuevents_waste_cost",
                             "Estimated money spent on idle GPUs, by kind (held_idle, unallocated)",
                             ["kind"], registry=r)
        self.gpus = Gauge("gpuevents_gpus", "GPUs known to the engine", registry=r)
        self.nodes_online = Gauge("gpuevents_nodes_online", "Nodes with a recent snapshot",
                                  registry=r)
