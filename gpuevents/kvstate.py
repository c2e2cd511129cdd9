"""Unreadable values in the KV bucket (a hand edit, a half-written value, an older format): read as absent, logged
once per key, counted by the key's kind (a fixed set, for a metric), and repaired by whoever read them."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Protocol, TypeVar

from pydantic import BaseModel

log = logging.getLogger("gpuevents.kv")

M = TypeVar("M", bound=BaseModel)

KINDS = ("lease", "incident", "snooze", "limits", "shares", "ledger", "approval", "stage", "other")
_LOGGED_KEYS_MAX = 10_000  # keys already reported; past this, each is reported again (bounded memory)


class _Entry(Protocol):
    @property
    def key(self) -> str: ...

    @property
    def value(self) -> bytes: ...


def kind_of(key: str) -> str:
    """The metric label of a key: its kind from KINDS (`actions.ledger.x` -> ledger), else `other`."""
    for token in key.split(".")[:3]:
        if token in KINDS:
            return token
    return "other"


class UnreadableValues:
    """How many unreadable values each kind of key has had, and which keys were already logged."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._logged: set[str] = set()

    def saw(self, key: str, error: Exception, repair: str) -> None:
        self.counts[kind_of(key)] += 1
        if key in self._logged:
            return
        if len(self._logged) >= _LOGGED_KEYS_MAX:
            self._logged.clear()
        self._logged.add(key)
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        log.error("unreadable value at %s in KV (%s): read as absent; %s", key, first, repair)


UNREADABLE = UnreadableValues()
"""This process's count (the engine's metrics read it as gpuevents_kv_unreadable_total)."""


def parse_or_none(model: type[M], entry: _Entry, repair: str = "it is written over") -> M | None:
    """`entry`'s value as `model`, or None (logged once, counted) when it cannot be read."""
    try:
        return model.model_validate_json(entry.value)
    except ValueError as e:  # pydantic's ValidationError is a ValueError
        UNREADABLE.saw(entry.key, e, repair)
        return None
