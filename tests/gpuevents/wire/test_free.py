"""`gpuevents free`'s request: sizes read as nvidia-smi counts them, labels, the API's query string; what is wrong
is said with what to write instead."""

from __future__ import annotations

import pytest

from gpuevents.wire.free import FreeQuery, FreeQueryError, parse_labels, parse_mem_mib


@pytest.mark.parametrize(("text", "mib"), [("40G", 40960), ("40GiB", 40960), ("40 gb", 40960), ("512", 512),
                                           ("1.5T", 1.5 * 1024 * 1024), ("4000M", 4000)])
def test_sizes_are_read_as_nvidia_smi_counts_them(text: str, mib: float) -> None:
    assert parse_mem_mib(text) == mib


@pytest.mark.parametrize("text", ["forty", "40Q", "-1G", ""])
def test_a_bad_size_says_what_to_write(text: str) -> None:
    with pytest.raises(FreeQueryError, match="must be a size like 40G"):
        parse_mem_mib(text)


def test_labels_are_a_value_or_just_the_key() -> None:
    assert parse_labels(["team=nlp", "pool", " zone = a "]) == {"team": "nlp", "pool": None, "zone": "a"}
    with pytest.raises(FreeQueryError, match="--label must be KEY=VALUE or KEY"):
        parse_labels(["=x"])


def test_the_apis_query_string_says_which_parameter_is_wrong() -> None:
    q = FreeQuery.from_params({"count": "2", "min_free_mem": "40G", "model": "H100", "limit": "5"}, ["team=nlp"])
    assert (q.count, q.min_free_mem_mib, q.model, q.limit, q.labels) == (2, 40960, "H100", 5, {"team": "nlp"})
    with pytest.raises(FreeQueryError, match="count must be a whole number from 1 to 1024, got '0'"):
        FreeQuery.from_params({"count": "0"})
