"""Two agents claiming one node: their snapshots interleave on the node's subject and overwrite each other.

Each agent process sends a random `agent_id` (in every snapshot and lifecycle event). One id following another is
a restart; ids that keep taking turns within `window_s` are two agents on one name (an `agent --simulate` beside
`up`, two hosts with one `agent.node_name`): reported once when it starts, and while it lasts in the status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuevents.events import AgentEvent, Event, SnapshotEvent


@dataclass
class _Agent:
    first: datetime
    last: datetime
    hostname: str | None
    pid: int | None = None

    def describe(self, agent_id: str) -> str:
        where = ", ".join(p for p in (f"host {self.hostname}" if self.hostname else "",
                                      f"pid {self.pid}" if self.pid else "") if p)
        return f"{agent_id[-8:]} ({where})" if where else agent_id[-8:]


@dataclass(frozen=True)
class ClaimConflict:
    cluster: str
    node: str
    agents: tuple[str, ...]

    def text(self) -> str:
        return (f"node {self.node} (cluster {self.cluster}) is claimed by {len(self.agents)} agents: "
                f"{'; '.join(self.agents)}. Their events overwrite each other (incidents fire and go): give each "
                "agent its own agent.node_name (a simulated one: gpuevents agent --simulate --node NAME)")


@dataclass
class NodeClaims:
    window_s: float = 60.0
    _nodes: dict[tuple[str, str], dict[str, _Agent]] = field(default_factory=dict)
    _reported: set[tuple[str, str, frozenset[str]]] = field(default_factory=set)

    def see(self, event: Event, at: datetime) -> ClaimConflict | None:
        """Note who sent `event`; a conflict the first time a set of agents is seen taking turns on a node."""
        if isinstance(event, SnapshotEvent):
            agent_id, hostname, pid = event.data.node.agent_id, event.data.node.hostname, None
        elif isinstance(event, AgentEvent):
            agent_id, hostname, pid = event.data.agent_id, event.data.hostname, event.data.pid
        else:
            return None
        if not agent_id:
            return None  # an agent older than agent ids
        key = (event.cluster, event.node)
        agents = self._nodes.setdefault(key, {})
        if len(agents) == 1 and isinstance(event, SnapshotEvent):  # the common case: the node's one agent again
            only = agents.get(agent_id)
            if only is not None:
                only.last = at
                return None
        if isinstance(event, AgentEvent) and event.type == "agent.stopping":
            agents.pop(agent_id, None)
            return None
        cutoff = at - timedelta(seconds=self.window_s)
        for other in [a for a, seen in agents.items() if seen.last < cutoff]:
            del agents[other]
        me = agents.get(agent_id)
        if me is None:
            me = agents[agent_id] = _Agent(first=at, last=at, hostname=hostname, pid=pid)
        me.last, me.hostname, me.pid = at, hostname or me.hostname, pid or me.pid
        rivals = self._taking_turns(agents, agent_id)
        if not rivals:
            return None
        ids = frozenset([agent_id, *rivals])
        if (*key, ids) in self._reported:
            return None
        self._reported.add((*key, ids))
        return self._conflict(key, agents, ids)

    @staticmethod
    def _taking_turns(agents: dict[str, _Agent], agent_id: str) -> list[str]:
        me = agents[agent_id]
        # Each has sent since the other first did: not one agent replacing another.
        return [a for a, other in agents.items() if a != agent_id and other.last > me.first and me.last > other.first]

    def _conflict(self, key: tuple[str, str], agents: dict[str, _Agent], ids: frozenset[str]) -> ClaimConflict:
        return ClaimConflict(cluster=key[0], node=key[1],
                             agents=tuple(agents[a].describe(a) for a in sorted(ids, key=lambda a: agents[a].first)))

    def conflicts(self, now: datetime) -> list[ClaimConflict]:
        """The nodes two or more agents claim now (each heard within the window)."""
        cutoff = now - timedelta(seconds=self.window_s)
        out = []
        for key, agents in self._nodes.items():
            live = {a: s for a, s in agents.items() if s.last >= cutoff}
            if len(live) < 2:
                continue
            if any(self._taking_turns(live, a) for a in live):
                out.append(self._conflict(key, live, frozenset(live)))
        return out
