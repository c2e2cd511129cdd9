"""Usage rows added up and priced: the totals every report line is made of. Pure."""

from __future__ import annotations

from dataclasses import dataclass

from gpuevents.costs import CostModel
from rules.usage.rollup import HOUR
from rules.usage.store import UsageRow


@dataclass
class UsageSum:
    """GPU-hours by state, utilization-seconds, energy and their cost (depreciation for the time, plus energy)."""

    busy_h: float = 0.0
    held_h: float = 0.0
    free_h: float = 0.0
    unknown_h: float = 0.0  # held with no activity signal: in no share of used or idle
    util_s: float = 0.0
    util_known_s: float = 0.0
    kwh: float = 0.0
    energy_cost: float = 0.0  # what `kwh` cost
    cap_saved_kwh: float = 0.0  # energy power caps saved
    cap_saved_cost: float = 0.0
    cost: float = 0.0
    held_cost: float = 0.0
    free_cost: float = 0.0

    def add(self, r: UsageRow, costs: CostModel) -> None:
        capital_h = costs.capital_daily(r.model or None) / 24
        self.busy_h += r.busy_s / HOUR
        self.held_h += r.held_s / HOUR
        self.free_h += r.free_s / HOUR
        self.unknown_h += r.unknown_s / HOUR
        self.util_s += r.util_s
        self.util_known_s += r.util_known_s
        kwh = r.busy_kwh + r.held_kwh + r.free_kwh + r.unknown_kwh
        self.kwh += kwh
        self.energy_cost += costs.energy_cost(kwh)
        self.cap_saved_kwh += r.cap_saved_kwh
        self.cap_saved_cost += costs.energy_cost(r.cap_saved_kwh)
        held = capital_h * r.held_s / HOUR + costs.energy_cost(r.held_kwh)
        free = capital_h * r.free_s / HOUR + costs.energy_cost(r.free_kwh)
        busy = capital_h * (r.busy_s + r.unknown_s) / HOUR + costs.energy_cost(r.busy_kwh + r.unknown_kwh)
        self.held_cost += held
        self.free_cost += free
        self.cost += held + free + busy

    def merge(self, other: UsageSum) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def util(self) -> float | None:
        """Time-weighted utilization over the time it was known, or None."""
        return self.util_s / self.util_known_s if self.util_known_s > 0 else None

    @property
    def gpu_h(self) -> float:
        return self.busy_h + self.held_h + self.free_h + self.unknown_h

    @property
    def busy_share(self) -> float | None:
        """Of the GPU-hours somebody held, the share they used (busy ÷ (busy + held idle)), in %."""
        held = self.busy_h + self.held_h
        return 100.0 * self.busy_h / held if held > 0 else None
