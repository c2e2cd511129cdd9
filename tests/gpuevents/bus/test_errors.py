"""nats-py's errors and JetStream's acks as the bus's own errors: no room to store, timeouts, no responders, a
stored message's ack as no error."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

from gpuevents.bus.errors import BusError, BusNoResponders, BusStoreFull, BusTimeout, ack_error, bus_errors, store_full


@pytest.mark.parametrize(("code", "text", "full"), [
    (10077, None, True), (10047, "", True), (None, "insufficient storage resources available", True),
    (None, "maximum messages exceeded", True), (10059, "stream not found", False), (None, None, False),
])
def test_store_full_knows_the_servers_codes_and_words(code: int | None, text: str | None, full: bool) -> None:
    assert store_full(code, text) is full


def test_a_stored_messages_ack_is_no_error_and_a_refusal_says_why() -> None:
    assert ack_error({"stream": "EVENTS", "seq": 4}, "publishing to a.b") is None
    refused = ack_error({"error": {"err_code": 10077, "description": "maximum bytes exceeded"}}, "publishing to a.b")
    assert isinstance(refused, BusStoreFull) and "(err_code 10077)" in str(refused)
    other = ack_error({"error": {"err_code": 10059, "description": "stream not found"}}, "publishing to a.b")
    assert type(other) is BusError and "stream not found" in str(other)


def test_an_ack_that_never_came_is_a_timeout_or_no_responders() -> None:
    assert isinstance(ack_error(nats.errors.TimeoutError(), "publishing to a.b"), BusTimeout)
    nobody = ack_error(nats.errors.NoRespondersError(), "publishing to a.b")
    assert isinstance(nobody, BusNoResponders) and str(nobody) == "no stream stores a.b"
    same = BusStoreFull("x")
    assert ack_error(same, "publishing") is same
    assert type(ack_error(OSError("reset"), "publishing")) is BusError


def test_bus_errors_turns_nats_errors_into_the_bus_own() -> None:
    with pytest.raises(BusTimeout, match="reading x timed out"), bus_errors("reading x"):
        raise nats.errors.TimeoutError
    with pytest.raises(BusNoResponders), bus_errors("reading x"):
        raise nats.errors.NoRespondersError
    with pytest.raises(BusError, match="reading x failed: ConnectionClosedError"), bus_errors("reading x"):
        raise nats.errors.ConnectionClosedError
    with pytest.raises(BusStoreFull, match="no room"), bus_errors("writing x"):
        raise nats.js.errors.APIError(code=400, err_code=10028, description="insufficient resources")


def test_a_jetstream_answer_that_is_not_about_room_is_left_to_the_caller() -> None:
    with pytest.raises(nats.js.errors.NotFoundError), bus_errors("reading x"):
        raise nats.js.errors.NotFoundError(code=404, err_code=10037, description="no message found")
