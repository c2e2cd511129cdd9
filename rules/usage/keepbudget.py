"""Keep budgets: how many keeps an owner and a team took this week, against `keep_budget` and
`teams.<name>.keeps_per_week`; past either, a keep waits for the rule's approving channel. Pure."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from gpuevents.config import Config


def week_start(now: datetime, timezone: str) -> datetime:
    """Monday 00:00 of `now`'s week in `timezone`."""
    local = now.astimezone(ZoneInfo(timezone))
    return (local - timedelta(days=local.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class BudgetUse:
    """Keeps taken this week before this one, and the budgets (None: none)."""

    owner: str
    owner_used: int
    owner_budget: int | None
    team: str
    team_used: int
    team_budget: int | None

    @property
    def over(self) -> str | None:
        """Why this keep is past a budget, or None."""
        if self.owner_budget is not None and self.owner_used >= self.owner_budget:
            return f"{self.owner} took {self.owner_used} of {self.owner_budget} keeps this week"
        if self.team_budget is not None and self.team_used >= self.team_budget:
            return f"team {self.team} took {self.team_used} of {self.team_budget} keeps this week"
        return None

    def text(self) -> str:
        """"3 of 5 keeps this week" (this keep counted), for the owner's budget, else the team's; "" without."""
        if self.owner_budget is not None:
            return f"{min(self.owner_used + 1, self.owner_budget)} of {self.owner_budget} keeps this week"
        if self.team_budget is not None:
            return f"{min(self.team_used + 1, self.team_budget)} of {self.team_budget} keeps this week for team " \
                   f"{self.team}"
        return ""


def budgets(config: Config, owner: str, team: str) -> tuple[int | None, int | None]:
    t = config.teams.get(team) if team else None
    return config.keep_budget.owner_budget(owner), (t.keeps_per_week if t is not None else None)
