"""The cost model (DESIGN §7 `costs`): what a GPU costs per hour, and how money is written."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from gpuevents.config import CostsConfig, GpuCost
from gpuevents.mig import instance_profile

HOURS_PER_DAY = 24.0
DAYS_PER_YEAR = 365.0

# Symbols for the currencies people most often configure; any other code is written after the amount.
CURRENCY_SYMBOLS: dict[str, str] = {
    "USD": "$",
    "CNY": "¥",
    "RMB": "¥",
    "JPY": "¥",
    "EUR": "€",
    "GBP": "£",
    "INR": "₹",
    "KRW": "₩",
}


class CostModel:
    """Daily and hourly cost of one GPU from config `costs`.

    daily = price / depreciation_years / 365 + power_w × 24 h / 1000 × energy_price_kwh × pue,
    with the measured power when there is one, else the model's rated power; hourly = daily / 24.
    """

    def __init__(self, costs: CostsConfig) -> None:
        self.costs = costs
        # Longest key first, so "A100 80GB" wins over "A100" when both match.
        self._models = sorted(costs.models.items(), key=lambda kv: (-len(kv[0]), kv[0]))
        self._cache: dict[str | None, GpuCost] = {}

    @property
    def currency(self) -> str:
        return self.costs.currency

    def gpu_cost(self, model: str | None) -> GpuCost:
        """The cost entry for a GPU model name: the longest configured key it contains, else the default."""
        hit = self._cache.get(model)
        if hit is not None:
            return hit
        found = self.costs.default
        if model:
            name = model.lower()
            for key, entry in self._models:
                if key.lower() in name:
                    found = entry
                    break
        self._cache[model] = found
        return found

    def capital_daily(self, model: str | None) -> float:
        entry = self.gpu_cost(model)
        return entry.price / entry.depreciation_years / DAYS_PER_YEAR

    def energy_daily(self, model: str | None, power_w: float | None) -> float:
        watts = self.gpu_cost(model).rated_power_w if power_w is None else max(power_w, 0.0)
        return watts * HOURS_PER_DAY / 1000.0 * self.costs.energy_price_kwh * self.costs.pue

    def daily(self, model: str | None, power_w: float | None = None) -> float:
        return self.capital_daily(model) + self.energy_daily(model, power_w)

    def hourly(self, model: str | None, power_w: float | None = None) -> float:
        return self.daily(model, power_w) / HOURS_PER_DAY

    def waste(self, model: str | None, power_w: float | None, idle_s: float) -> float:
        """What `idle_s` seconds of an idle GPU cost."""
        return self.hourly(model, power_w) * max(idle_s, 0.0) / 3600.0

    def energy_cost(self, kwh: float) -> float:
        return kwh * self.costs.energy_price_kwh * self.costs.pue

    def format(self, amount: float) -> str:
        """`$12.40`, `¥88.00`, `-$3.10`; an unknown currency code goes after: `12.40 CHF`."""
        sign = "-" if amount < 0 else ""
        text = f"{abs(amount):,.2f}"
        code = self.currency.upper()
        symbol = CURRENCY_SYMBOLS.get(code)
        if symbol is None:
            return f"{sign}{text} {self.currency}"
        return f"{sign}{symbol}{text}"


class _Reported(Protocol):
    """What physical_shares reads of a reported GPU (read-only, so frozen models such as GpuInfo match)."""

    @property
    def index(self) -> int: ...
    @property
    def uuid(self) -> str | None: ...
    @property
    def mig_parent(self) -> str | None: ...
    @property
    def model(self) -> str | None: ...


def physical_shares(gpus: Iterable[_Reported]) -> dict[int, float]:
    """What share of a physical GPU each reported GPU is, so costs and GPU-hours count each GPU once: 1 for a
    whole GPU; for a MIG instance, its profile's share of the compute slices (a 3g.20gb instance of an A100 is
    3/7 of it; see gpuevents/mig.py), or 1/n of its parent's n reported instances where a profile is unknown;
    0 for a MIG parent whose instances are reported (they are its parts). Slices left unpartitioned are
    counted nowhere: no job can be given them until the GPU is partitioned again."""
    gpus = list(gpus)
    instances: dict[str, list[_Reported]] = {}
    for g in gpus:
        if g.mig_parent:
            instances.setdefault(g.mig_parent, []).append(g)
    by_profile: dict[str, dict[int, float]] = {}
    for parent, parts in instances.items():
        profiles = [instance_profile(g.model) for g in parts]
        shares = [p.compute_share for p in profiles if p is not None]
        if len(shares) == len(parts) and sum(shares) <= 1.0 + 1e-9:
            by_profile[parent] = {g.index: s for g, s in zip(parts, shares, strict=True)}
        else:
            by_profile[parent] = {g.index: 1.0 / len(parts) for g in parts}
    out = {}
    for g in gpus:
        if g.mig_parent:
            out[g.index] = by_profile[g.mig_parent][g.index]
        else:
            out[g.index] = 0.0 if g.uuid and g.uuid in instances else 1.0
    return out
