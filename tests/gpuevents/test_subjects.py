"""KV key tokens: the subject escape with `=` for `%`, valid in a KV key, distinct for distinct names."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gpuevents import subjects as S

KV_TOKEN = re.compile(r"[-_=A-Za-z0-9]+")  # a KV key allows [-/_=.A-Za-z0-9]; '.' separates tokens


@given(name=st.text(min_size=1, max_size=40))
def test_a_kv_token_is_the_subject_escape_marked_with_equals(name: str) -> None:
    token = S.kv_token(name)
    assert KV_TOKEN.fullmatch(token)
    assert token == S.escape_token(name).replace("%", "=")
    assert S.unescape_token(token.replace("=", "%")) == name


def test_distinct_names_never_share_a_kv_token() -> None:
    assert S.kv_token("a.b") != S.kv_token("a=2Eb")
    assert S.kv_token("a b") != S.kv_token("a_b")
    assert S.kv_token("") == "="
