"""Scheduler jobs across nodes: each node's snapshot says which of its GPUs and processes belong to which job;
a job's parts on every node are joined into one `job` entity (a 4-node job with 32 idle GPUs is one incident).

A job's view is rebuilt whenever one of its nodes changes (its GPUs' readings are the job's), and reported with no
delta, so every job rule is evaluated again; a job no node reports any more is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gpuevents.agentdata import JobInfo
from gpuevents.events import JobEnded
from rules.core.state.node import Entity, NodeState
from rules.lang.exemptions import Exemptions
from rules.lang.expr import CLOCK_KEY
from rules.lang.views import EntityView, EvalClock, GpuView, JobView

log = logging.getLogger(__name__)
SUMMARY_FIELDS = ("hours", "gpu_hours", "mean_util_pct", "peak_util_pct", "mean_sm_active_pct", "peak_mem_mib",
                  "p95_util_pct", "p95_sm_active_pct", "p95_mem_mib", "idle_share_pct", "cost", "cost_text",
                  "smaller_fit")


def ended_entity(ended: JobEnded, node_key: str, node: str, cluster: str, clock: EvalClock,
                 owners: Mapping[str, str]) -> Entity:
    """The job as its `job.ended` event closes it: `ended_at` and `summary` set, no GPUs held any more. It is
    evaluated once and closed; it never joins the fleet's tables."""
    key = f"job/{ended.scheduler}/{ended.id}"
    user = ended.user
    view = JobView(
        clock, id=ended.id, scheduler=ended.scheduler, name=ended.name, user=user,
        owner=owners.get(user, user) if user else None, account=ended.account, partition=ended.partition,
        qos=ended.qos, namespace=ended.namespace, nodes=list(ended.nodes), gpu_count=ended.gpu_count, gpus=[],
        util_pct=ended.mean_util_pct, idle=False, idle_since=None, started_at=ended.started_at, labels={},
        ended_at=ended.ended_at, summary={f: getattr(ended, f) for f in SUMMARY_FIELDS},
    )
    return Entity(key, key, "job", node_key, view, {
        "job": view, "gpus": [], "entity": EntityView(key, "job", node, cluster), CLOCK_KEY: clock,
    })


def job_id(info: JobInfo) -> str:
    """The entity id of a job: `job/<scheduler>/<id>` (DESIGN §3.1)."""
    return f"job/{info.scheduler}/{info.id}"


def job_key(info: JobInfo) -> str:
    """The entity key of a job: its id and, for a Kubernetes job, its top owner's uid (`@<uid>`), as a process's
    key holds its create time: an owner deleted and created again under the same name is a new entity, whose
    incidents start from zero (DESIGN §3.4). Parts of one name that disagree on the uid are not joined."""
    return f"{job_id(info)}@{info.controller_uid}" if info.controller_uid else job_id(info)


class Jobs:
    """Which nodes hold parts of which jobs, and the job entities built from them."""

    def __init__(self, clock: EvalClock, owners: Mapping[str, str]) -> None:
        self.clock = clock
        self.owners = owners
        self.parts: dict[str, dict[str, JobInfo]] = {}  # job key -> node key -> that node's part
        self.of_node: dict[str, set[str]] = {}  # node key -> its job keys
        self.exemptions = Exemptions()  # gpuevents.io/keep-until and exclude annotations, by job id
        self.exemptions_changed: set[str] = set()  # job ids whose exemptions changed: their entities, anywhere

    def update_node(self, ns: NodeState, jobs: list[JobInfo], nodes: Mapping[str, NodeState],
                    by_kind: dict[str, dict[str, Entity]]) -> tuple[list[Entity], list[Entity]]:
        """The node now holds `jobs`: the job entities to evaluate again, and those that are gone."""
        new = {job_key(j): j for j in jobs}
        old = self.of_node.get(ns.key, set())
        for k in old - set(new):
            self._drop(k, ns.key)
        for k, j in new.items():
            self.parts.setdefault(k, {})[ns.key] = j
        if new:
            self.of_node[ns.key] = set(new)
        else:
            self.of_node.pop(ns.key, None)
        return self._rebuild(old | set(new), nodes, by_kind)

    def remove_node(self, node_key: str, nodes: Mapping[str, NodeState],
                    by_kind: dict[str, dict[str, Entity]]) -> tuple[list[Entity], list[Entity]]:
        keys = self.of_node.pop(node_key, set())
        for k in keys:
            self._drop(k, node_key)
        return self._rebuild(keys, nodes, by_kind)

    def _drop(self, key: str, node_key: str) -> None:
        parts = self.parts.get(key)
        if parts is not None:
            parts.pop(node_key, None)
            if not parts:
                del self.parts[key]

    def _rebuild(self, keys: set[str], nodes: Mapping[str, NodeState],
                 by_kind: dict[str, dict[str, Entity]]) -> tuple[list[Entity], list[Entity]]:
        table = by_kind["job"]
        changed: list[Entity] = []
        gone: list[Entity] = []
        for key in sorted(keys):
            parts = {nk: p for nk, p in self.parts.get(key, {}).items() if nk in nodes}
            if not parts:
                old = table.pop(key, None)
                if old is not None:
                    if old.view.id in self.exemptions.active:
                        self.exemptions_changed.add(old.view.id)
                    self.exemptions.remove(old.view.id)
                    gone.append(old)
                continue
            ent = self._entity(key, parts, nodes)
            self.refresh_exemption(ent)
            table[key] = ent
            changed.append(ent)
        return changed, gone

    def refresh_exemption(self, ent: Entity) -> None:
        """Take the job's annotations as of now, and show its exemption on its view (a job not rebuilt since its
        exemption ended shows what a rebuilt one would)."""
        before = self.exemptions.active.get(ent.view.id)
        for bad in self.exemptions.update(ent.view.id, ent.view.annotations, self.clock.utc):
            log.warning("job %s: %s (not applied: fix the annotation)", ent.view.id, bad)
        if self.exemptions.active.get(ent.view.id) != before:
            self.exemptions_changed.add(ent.view.id)
        ex = self.exemptions.until(ent.view.id, self.clock.utc)
        ent.view.exempt_until = ex.until if ex is not None else None
        ent.view.exemption = ex.source if ex is not None else None
        ent.view.exemptions_malformed = [str(m) for m in self.exemptions.malformed.get(ent.view.id, [])]

    def take_exemptions_changed(self) -> set[str]:
        """The job ids whose exemptions started, changed or ended since asked last (their GPUs and processes
        may be on other nodes than the one that changed the job)."""
        out, self.exemptions_changed = self.exemptions_changed, set()
        return out

    def _entity(self, key: str, parts: Mapping[str, JobInfo], nodes: Mapping[str, NodeState]) -> Entity:
        order = sorted(parts, key=lambda nk: nodes[nk].name)
        first = parts[order[0]]
        gpus: list[GpuView] = []
        for nk in order:
            by_index = {g.index: g for g in nodes[nk].gpu_views}
            gpus += [by_index[i] for i in parts[nk].gpus if i in by_index]
        utils = [g.util_pct for g in gpus if g.util_pct is not None]
        idle = bool(gpus) and all(g.idle for g in gpus)
        since = [g.idle_since for g in gpus if g.idle_since is not None]
        user = next((p.user for p in parts.values() if p.user), None)
        owner = next((p.owner for p in parts.values() if p.owner), None) or (self.owners.get(user, user) if user
                                                                             else None)
        view = JobView(
            self.clock, id=first.id, scheduler=first.scheduler, name=first.name, user=user, owner=owner,
            account=first.account, partition=first.partition, qos=first.qos, namespace=first.namespace,
            controller=first.controller, nodes=[nodes[nk].name for nk in order], gpu_count=len(gpus), gpus=gpus,
            util_pct=round(sum(utils) / len(utils), 2) if utils else None, idle=idle,
            idle_since=max(since) if idle and len(since) == len(gpus) else None,
            started_at=min((p.started_at for p in parts.values() if p.started_at), default=None),
            time_limit_s=first.time_limit_s, labels=dict(first.labels), annotations=dict(first.annotations),
            pods=sorted({pod for p in parts.values() for pod in p.pods}), controller_uid=first.controller_uid,
            controller_generation=first.controller_generation,
        )
        head = nodes[order[0]]
        eid = job_id(first)
        return Entity(key, eid, "job", head.key, view, {
            "job": view, "gpus": gpus, "entity": EntityView(eid, "job", head.name, head.cluster),
            CLOCK_KEY: self.clock,
        })
