"""The engine's decoder: a node's repeated snapshot data is validated once, and every result is decode_event's."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpuevents.agentdata import NodeSnapshot
from gpuevents.events import decode_event, encode_event, make_event
from rules.intake.decoder import RepeatDecoder
from tests.quick import examples
from tests.rules.helpers import T0, at, gpu, proc, snapshot


def raw_snapshot(t: float, node: str = "n1", temp: float = 50.0) -> bytes:
    return encode_event(snapshot(at(t), node, gpus=[gpu(0, temp_c=temp, pids=[42])], processes=[proc(42)]))


def test_a_repeated_snapshot_reuses_the_validated_data_and_equals_decode_event() -> None:
    dec = RepeatDecoder()
    first = dec.decode(raw_snapshot(0))
    dec.accepted(first)
    raw = raw_snapshot(15)
    again = dec.decode(raw)
    assert again == decode_event(raw) and again.time == at(15)
    assert again.data is first.data  # validated once
    changed = dec.decode(raw_snapshot(30, temp=95))
    assert isinstance(changed.data, NodeSnapshot)
    assert changed.data is not first.data and changed.data.gpus[0].temp_c == 95
    other_node = dec.decode(raw_snapshot(45, node="n2"))
    assert other_node.data is not first.data and other_node.node == "n2"


@pytest.mark.parametrize(("field", "value"), [
    ("time", "not a time"), ("specversion", "2.0"), ("source", 7), ("source", ["node/n1"]), ("type", "gpu.hot"),
])
def test_a_bad_envelope_around_repeated_data_fails_as_decode_event_does(field: str, value: Any) -> None:
    dec = RepeatDecoder()
    dec.accepted(dec.decode(raw_snapshot(0)))
    obj = orjson.loads(raw_snapshot(15))
    obj[field] = value
    raw = orjson.dumps(obj)
    with pytest.raises(ValidationError):
        decode_event(raw)
    with pytest.raises(ValidationError):
        dec.decode(raw)


def test_other_events_and_other_layouts_take_the_full_path() -> None:
    dec = RepeatDecoder()
    dec.accepted(dec.decode(raw_snapshot(0)))
    hot = encode_event(make_event("gpu.hot", "n1", gpu(0, temp_c=99), time=at(5)))
    assert dec.decode(hot) == decode_event(hot)
    reordered = orjson.dumps({"data": orjson.loads(raw_snapshot(10))["data"], **{
        k: v for k, v in orjson.loads(raw_snapshot(10)).items() if k != "data"}})
    assert dec.decode(reordered) == decode_event(reordered)
    spaced = raw_snapshot(20) + b"\n"
    assert dec.decode(spaced) == decode_event(spaced)


ENVELOPE_VALUES = st.one_of(st.none(), st.integers(-2, 2), st.text(max_size=8), st.sampled_from(
    ["node/n1", "node/n2", "1.0", "node.snapshot", "gpu.hot", T0.isoformat(), "2026-01-05T00:00:15Z", "default"]))


@settings(max_examples=examples(150), deadline=None)
@given(changes=st.dictionaries(st.sampled_from(["specversion", "id", "source", "cluster", "time", "type", "extra"]),
                               ENVELOPE_VALUES, max_size=3), same_data=st.booleans())
def test_any_envelope_decodes_as_decode_event_decodes_it(changes: dict[str, Any], same_data: bool) -> None:
    dec = RepeatDecoder()
    dec.accepted(dec.decode(raw_snapshot(0)))
    obj = orjson.loads(raw_snapshot(15, temp=50.0 if same_data else 60.0))
    data = obj.pop("data")
    obj.update(changes)
    raw = orjson.dumps({**obj, "data": data})

    def outcome(fn: Any) -> Any:
        try:
            return ("ok", fn(raw))
        except ValidationError:
            return ("invalid", None)

    assert outcome(dec.decode) == outcome(decode_event)


def test_a_snapshot_is_kept_for_its_node_only_once_accepted() -> None:
    dec = RepeatDecoder()
    first = dec.decode(raw_snapshot(0))
    again = dec.decode(raw_snapshot(15))
    assert again.data is not first.data and len(dec) == 0  # not accepted: nothing kept, validated afresh
    dec.accepted(again)
    assert len(dec) == 1 and dec.decode(raw_snapshot(30)).data is again.data
    dec.accepted(first)  # not the last decoded: ignored
    assert len(dec) == 1
