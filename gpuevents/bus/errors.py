"""The bus's errors, and how a JetStream ack (or its absence) becomes one."""

from __future__ import annotations

from typing import Any

import nats.errors


class BusError(Exception):
    """A bus operation failed."""


class BusTimeout(BusError):
    pass


class BusNoResponders(BusError):
    pass


class KvExists(BusError):
    """`create` of a key that is already there."""


class KvWrongRevision(BusError):
    """`update` whose `last` revision is not the current one."""


def ack_error(r: dict[str, Any] | BaseException, what: str) -> BusError | None:
    """None for a stored message's ack, else the BusError its reply or exception means."""
    if isinstance(r, dict):
        if "error" not in r:
            return None
        e = r["error"]
        return BusError(f"{what} failed: {e.get('description', e)} (err_code {e.get('err_code')})")
    if isinstance(r, nats.errors.NoRespondersError):
        return BusNoResponders(f"no stream stores {what.rsplit(' ', 1)[-1]}")
    if isinstance(r, TimeoutError | nats.errors.TimeoutError):
        return BusTimeout(f"{what} timed out")
    if isinstance(r, BusError):
        return r
    return BusError(f"{what} failed: {r}")
