"""The Prometheus client's edges: auth from the environment, answers that are not a matrix, pacing."""

from __future__ import annotations

import base64

import pytest

from rules.history.promapi import PromClient, PromError, auth_header, parse_matrix


def test_a_token_wins_over_basic_auth_and_neither_is_none() -> None:
    assert auth_header({"GPUEVENTS_PROMETHEUS_TOKEN": "t0k"}) == "Bearer t0k"
    basic = auth_header({"GPUEVENTS_PROMETHEUS_USER": "ops", "GPUEVENTS_PROMETHEUS_PASSWORD": "s3cret"})
    assert basic == "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert auth_header({}) is None


def test_an_answer_that_is_not_a_matrix_is_said() -> None:
    with pytest.raises(PromError, match="bad_data: parse error"):
        parse_matrix({"status": "error", "errorType": "bad_data", "error": "bad_data: parse error"})
    with pytest.raises(PromError, match="expected a matrix"):
        parse_matrix({"status": "success", "data": {"resultType": "vector", "result": []}})
    (s,) = parse_matrix({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"gpu": "0"}, "values": [[1.5, "3"], [2.5, "NaN"]]}]}})
    assert s.labels == {"gpu": "0"} and s.values[0] == (1.5, 3.0) and s.values[1][1] != s.values[1][1]


def test_requests_are_paced() -> None:
    clock = [100.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    client = PromClient("http://127.0.0.1:9", pace_s=0.5, sleep=sleep, monotonic=lambda: clock[0], retries=0)
    for _ in range(2):
        with pytest.raises(PromError, match="no answer after 1 tries"):
            client.query_range("up", 0, 60, 60)
    assert slept == [0.5]


def test_a_url_that_is_not_one_is_said() -> None:
    with pytest.raises(PromError, match="'prometheus:9090' is not a URL; write it like http://prometheus:9090"):
        PromClient("prometheus:9090")
