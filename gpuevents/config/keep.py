"""Keep budgets (`keep_budget`): how many keeps an owner may take in a week before a keep waits for approval;
a team's budget is `teams.<name>.keeps_per_week` (gpuevents/config/__init__.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class KeepBudgetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # as every section of gpuevents/config/__init__.py

    per_owner: int | None = Field(None, ge=0, description="keeps each owner may take per week (Monday to Monday "
                                  "in engine.timezone); null: no budget")
    owners: dict[str, int] = Field(default_factory=dict, description="per owner (as keeps name them: the Slack "
                                   "user or the CLI's --by), overriding per_owner")

    def owner_budget(self, owner: str) -> int | None:
        return self.owners.get(owner, self.per_owner)
