"""`gpuevents.trusted.Builder` gives what `model_construct` gives, for every model the core builds with it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, Field

from gpuevents.records import AuditRecord
from gpuevents.trusted import Builder
from rules.core.incidents import Incident, Transition

T = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)

CASES = [
    (Incident, dict(id="i1", rule="r", rule_hash="h", entity_id="n1/gpu0", entity_key="n1/gpu0", entity_kind="gpu",
                    cluster="c", node="n1", status="pending", active_at=T)),
    (Incident, dict(id="i2", rule="r", entity_id="n1", entity_key="n1", entity_kind="node", status="firing",
                    active_at=T, fired_at=T, sends=1, warnings={})),
    (Transition, dict(time=T, rule="r", entity_id="e", entity_key="e", incident_id="i", cluster="c",
                      from_status="inactive", to_status="pending", reason="")),
    (AuditRecord, dict(id="a", time=T, kind="transition", rule="r", entity_id="e", cluster="c", incident_id="i",
                       from_status="pending", to_status="firing", detail=None)),
    (AuditRecord, dict(time=T, kind="reload", detail="3 rules loaded")),
]


@pytest.mark.parametrize(("model", "values"), CASES)
def test_builder_equals_model_construct(model: type[BaseModel], values: dict[str, Any]) -> None:
    ours, theirs = Builder(model)(**values), model.model_construct(**values)
    assert list(ours.__dict__) == list(theirs.__dict__)
    assert ours.model_fields_set == theirs.model_fields_set
    if "id" not in values and "id" in model.model_fields:
        theirs = theirs.model_copy(update={"id": ours.__dict__["id"]})  # a fresh id each: the rest must be equal
    assert ours == theirs and ours.model_dump_json() == theirs.model_dump_json()
    if "id" not in values and "id" in model.model_fields:  # a default factory runs for each instance, as pydantic's
        assert Builder(model)(**values).__dict__["id"] != ours.__dict__["id"]
    copied = ours.model_copy(update={"rule": "other"})
    assert copied.__dict__["rule"] == "other" and "rule" in copied.model_fields_set


def test_mutable_defaults_are_not_shared() -> None:
    class M(BaseModel):
        tags: list[str] = ["a"]
        meta: dict[str, int] = Field(default_factory=dict)

    build = Builder(M)
    a, b = build(), build()
    a.tags.append("b")
    a.meta["x"] = 1
    assert b.tags == ["a"] and b.meta == {}


def test_refuses_models_it_cannot_build_exactly() -> None:
    class Aliased(BaseModel):
        x: int = Field(alias="y")

    with pytest.raises(TypeError, match="aliases"):
        Builder(Aliased)
