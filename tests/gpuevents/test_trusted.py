"""`gpuevents.trusted.Builder` gives what `model_construct` gives, for every model the core builds with it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel, Field

from gpuevents.records import AuditRecord
from gpuevents.trusted import Builder, updated
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


def test_frozen_models_share_their_fields_set_and_copies_leave_it_alone() -> None:
    build = Builder(Incident)
    values = CASES[0][1]
    a, b = build(**values), build(**{**values, "id": "other"})
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    shared = set(a.model_fields_set)
    copied = a.model_copy(update={"resolved_by": "ops"})  # pydantic copies the set before adding to it
    assert "resolved_by" in copied.model_fields_set and a.model_fields_set == shared == b.model_fields_set


def test_mutable_models_keep_a_fields_set_each() -> None:
    class M(BaseModel):
        x: int = 0
        y: int = 0

    build = Builder(M)
    a, b = build(x=1), build(x=2)
    a.y = 3  # pydantic adds `y` to a's set in place
    assert a.model_fields_set == {"x", "y"} and b.model_fields_set == {"x"}


@pytest.mark.parametrize("update", [
    {"status": "firing", "fired_at": T, "last_sent_at": T, "sends": 1},
    {"staged": 2},
    {"status": "inactive", "resolved_at": T, "resolve_reason": "condition"},
])
@pytest.mark.parametrize(("model", "values"), [c for c in CASES if c[0] is Incident])
def test_updated_equals_model_copy(model: type[BaseModel], values: dict[str, Any], update: dict[str, Any]) -> None:
    base = Builder(model)(**values)
    ours, theirs = updated(base, update), base.model_copy(update=update)
    assert ours.__dict__ == theirs.__dict__ and list(ours.__dict__) == list(theirs.__dict__)
    assert ours.model_fields_set == theirs.model_fields_set
    assert ours == theirs and ours.model_dump_json() == theirs.model_dump_json()
    assert base.model_fields_set == set(values)  # the original is untouched
    assert updated(base, update).__pydantic_fields_set__ is ours.__pydantic_fields_set__
