"""Which reading says a GPU is idle: a signal and its threshold, chosen per GPU model; the agent adds hysteresis."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal, get_args

IdleSignal = Literal["utilization", "sm_active", "power"]
IDLE_SIGNALS: tuple[str, ...] = get_args(IdleSignal)


@dataclass(frozen=True, slots=True)
class IdleRule:
    """`signal` below `below` is idle (percent for utilization and sm_active, watts for power); with
    `power_below_w`, the power must be below that too (the second signal)."""

    signal: IdleSignal = "utilization"
    below: float = 5.0
    power_below_w: float | None = None

    def verdict(self, util_pct: float | None, sm_active_pct: float | None, power_w: float | None) -> bool | None:
        """True: this sample is idle; False: it is busy; None: the signal was not read, so it is no evidence.

        A second signal that was not read does not overrule the first: the first decides alone.
        """
        if self.signal == "utilization":
            value = util_pct
        elif self.signal == "sm_active":
            value = sm_active_pct
        else:
            value = power_w
        if value is None:
            return None
        if value >= self.below:
            return False
        if self.power_below_w is not None and power_w is not None:
            return power_w < self.power_below_w
        return True

    def describe(self) -> str:
        unit = " W" if self.signal == "power" else "%"
        text = f"{self.signal} < {self.below:g}{unit}"
        if self.power_below_w is not None:
            text += f" and power < {self.power_below_w:g} W"
        return text


def model_matches(pattern: str, model: str | None) -> bool:
    """A glob on the model name, case-insensitive: `*H100*` matches `NVIDIA H100 80GB HBM3`."""
    return model is not None and fnmatchcase(model.lower(), pattern.lower())
