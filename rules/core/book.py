"""The incident book: open incidents by rule and by entity, their next deadlines, and the snoozes.

It is the one owner of these: evaluation reads and records through it. Each open incident's next deadline (a
`for` coming due, the next repeat or stage) is kept as the incident changes, in a heap with one live entry per
incident, so the earliest is known and what is due is found without looking at any incident that is not.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from datetime import datetime

from rules.core.incidents import Incident, next_deadline
from rules.core.inputs import Snooze
from rules.lang.model import Rule

_POP_ONE_BY_ONE = 64
"""Due deadlines taken off the heap one at a time; past this many, the rest in one pass."""


class IncidentBook:
    """Open incidents (rule -> entity key -> incident), the rules open on each entity, deadlines and snoozes."""

    __slots__ = ("_by_entity", "_deadline_of", "_heap", "_incidents", "_parked", "_snoozes")

    def __init__(self) -> None:
        self._incidents: dict[str, dict[str, Incident]] = {}
        self._by_entity: dict[str, set[str]] = {}
        self._snoozes: dict[tuple[str, str], Snooze] = {}  # (rule, entity id) -> snooze
        self._deadline_of: dict[tuple[str, str], datetime] = {}  # (rule, key) -> its incident's next deadline
        # (deadline as a timestamp: floats compare faster than aware datetimes, deadline, rule, key); stale skipped
        self._heap: list[tuple[float, str, str, datetime]] = []
        self._parked: set[tuple[str, str]] = set()  # due, taken off the heap, not changed since

    # ------------------------------------------------------------------ incidents
    @property
    def incidents(self) -> Mapping[str, Mapping[str, Incident]]:
        """Read only: the open incidents by rule and entity key."""
        return self._incidents

    @property
    def snoozes(self) -> Mapping[tuple[str, str], Snooze]:
        """Read only: the snoozes by (rule, entity id)."""
        return self._snoozes

    def rule_names(self) -> list[str]:
        """The rules with a place in the book (a copy)."""
        return list(self._incidents)

    def add_rule(self, name: str) -> None:
        self._incidents.setdefault(name, {})

    def drop_rule(self, name: str) -> list[Incident]:
        """Forget a rule's incidents (closed or restored elsewhere); the ones it had."""
        incs = self._incidents.pop(name, {})
        for inc in incs.values():
            self._unindex(inc)
        return list(incs.values())

    def of_rule(self, name: str) -> dict[str, Incident]:
        """Read only: the rule's open incidents by entity key."""
        return self._incidents[name]

    def get(self, rule: str, key: str) -> Incident | None:
        return self._incidents[rule].get(key)

    def rules_on(self, key: str) -> tuple[str, ...]:
        """The rules with an open incident on the entity `key` (a copy: closing one does not disturb it)."""
        names = self._by_entity.get(key)
        return tuple(names) if names else ()

    def has_any(self, key: str) -> bool:
        return key in self._by_entity

    def __iter__(self) -> Iterator[Incident]:
        for incs in self._incidents.values():
            yield from incs.values()

    def __len__(self) -> int:
        return sum(map(len, self._incidents.values()))

    def put(self, rule: Rule, inc: Incident) -> None:
        """Record `inc` as it is now: open, it is indexed and its next deadline noted; closed, it is dropped."""
        if not inc.open:
            self.remove(inc)
            return
        self._incidents[rule.name][inc.entity_key] = inc
        self._by_entity.setdefault(inc.entity_key, set()).add(rule.name)
        ident = (rule.name, inc.entity_key)
        d = None if rule.scheduled else next_deadline(inc, rule.for_s, rule.repeat_s, rule.stages)
        if d is None:
            self._deadline_of.pop(ident, None)
            self._parked.discard(ident)
        elif self._deadline_of.get(ident) != d:
            self._deadline_of[ident] = d
            self._parked.discard(ident)
            heapq.heappush(self._heap, (d.timestamp(), rule.name, inc.entity_key, d))
            if len(self._heap) > 64 + 2 * len(self._deadline_of):
                self._compact()

    def update(self, updated: Incident) -> bool:
        """Take `updated` for the open incident of its id, where one is open, in a change that moves no deadline
        (what became of its warnings); whether it was."""
        incs = self._incidents.get(updated.rule)
        cur = incs.get(updated.entity_key) if incs is not None else None
        if incs is None or cur is None or cur.id != updated.id:
            return False
        incs[updated.entity_key] = updated
        return True

    def remove(self, inc: Incident) -> None:
        incs = self._incidents.get(inc.rule)
        if incs is not None:
            incs.pop(inc.entity_key, None)
        self._unindex(inc)

    def _unindex(self, inc: Incident) -> None:
        rules = self._by_entity.get(inc.entity_key)
        if rules is not None:
            rules.discard(inc.rule)
            if not rules:
                del self._by_entity[inc.entity_key]
        self._deadline_of.pop((inc.rule, inc.entity_key), None)
        self._parked.discard((inc.rule, inc.entity_key))

    # ------------------------------------------------------------------ deadlines
    @property
    def deadlines(self) -> Mapping[tuple[str, str], datetime]:
        """Read only: each open incident's next deadline by (rule, entity key)."""
        return self._deadline_of

    def deadline(self, rule: str, key: str) -> datetime | None:
        """The (rule, key) incident's next deadline, if it has one."""
        return self._deadline_of.get((rule, key))

    def pop_due(self, now: datetime) -> list[tuple[str, str]]:
        """The (rule, key) of every incident whose deadline is at or before `now`, taken off the heap: they are
        evaluated now, and each that changes notes its next deadline again. One that does not (its node is
        offline, say) keeps its past deadline, off the heap: its node's next event sees it due (`deadline`),
        and no tick is asked for it."""
        heap, live, parked = self._heap, self._deadline_of, self._parked
        out: list[tuple[str, str]] = []
        now_ts = now.timestamp()
        popped = 0
        while heap and heap[0][0] <= now_ts:
            if popped == _POP_ONE_BY_ONE:
                # Many are due at once (a fleet's `for` deadlines falling together): take them out in one pass
                # and sort them, in the order the heap would give them.
                due = [e for e in heap if e[0] <= now_ts]
                self._heap = heap = [e for e in heap if e[0] > now_ts]
                heapq.heapify(heap)
                due.sort()
            else:
                due = [heapq.heappop(heap)]
                popped += 1
            for _, rule, key, d in due:
                ident = (rule, key)
                if live.get(ident) == d and ident not in parked:
                    parked.add(ident)
                    out.append(ident)
        return out

    def next_deadline(self) -> datetime | None:
        """The earliest deadline of any open incident (it may be past: an offline node's, due when it is back)."""
        heap, live = self._heap, self._deadline_of
        while heap:
            _, rule, key, d = heap[0]
            if live.get((rule, key)) == d and (rule, key) not in self._parked:
                return d
            heapq.heappop(heap)
        return None

    def _compact(self) -> None:
        self._heap = [(d.timestamp(), r, k, d) for (r, k), d in self._deadline_of.items() if (r, k) not in self._parked]
        heapq.heapify(self._heap)

    # ------------------------------------------------------------------ snoozes
    def snooze(self, rule: str, entity_id: str) -> Snooze | None:
        return self._snoozes.get((rule, entity_id)) if self._snoozes else None

    def set_snooze(self, s: Snooze) -> None:
        self._snoozes[(s.rule, s.entity_id)] = s

    def lift_snooze(self, rule: str, entity_id: str) -> Snooze | None:
        return self._snoozes.pop((rule, entity_id), None)

    def snoozes_ended(self, now: datetime) -> list[Snooze]:
        """The snoozes that ended by `now`, lifted."""
        ended = [k for k, s in self._snoozes.items() if s.until <= now]
        return [self._snoozes.pop(k) for k in ended]

    def next_snooze_end(self) -> datetime | None:
        return min((s.until for s in self._snoozes.values()), default=None)
