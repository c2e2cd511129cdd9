"""The bus's errors, and how a JetStream ack (or its absence) becomes one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import nats.errors
import nats.js.errors


class BusError(Exception):
    """A bus operation failed."""


class BusTimeout(BusError):
    pass


class BusNoResponders(BusError):
    pass


class BusStoreFull(BusError):
    """JetStream refused to store: the server's, the account's or a stream's limits are reached (DESIGN §7.1).
    Writers retry and say so; space that returns (old messages aged out, a limit raised) ends it."""


# nats-server's codes for "insufficient resources", "insufficient memory / storage resources available",
# "resource limits exceeded for account", "maximum messages / bytes exceeded" (a stream that discards new ones)
STORE_FULL_CODES = frozenset({10023, 10027, 10028, 10047, 10054, 10077, 10078})
_STORE_FULL_WORDS = ("insufficient", "resource limits", "maximum messages", "maximum bytes", "storage resources")


def store_full(err_code: int | None, description: str | None) -> bool:
    """Whether a JetStream error means there is no room to store."""
    text = (description or "").lower()
    return (err_code in STORE_FULL_CODES) or any(w in text for w in _STORE_FULL_WORDS)


class BusUnreachable(BusError):
    """No NATS server answered within the time a command gives it (the message names the address)."""


class KvExists(BusError):
    """`create` of a key that is already there."""


class KvWrongRevision(BusError):
    """`update` whose `last` revision is not the current one."""


@contextmanager
def bus_errors(what: str) -> Iterator[None]:
    """nats-py's timeouts and connection errors as BusTimeout / BusError, so that callers (the lease, the
    stores) ride out an outage by catching the bus's own errors."""
    try:
        yield
    except nats.js.errors.APIError as e:
        if store_full(getattr(e, "err_code", None), getattr(e, "description", None)):
            raise BusStoreFull(f"{what}: JetStream has no room ({e})") from None
        raise  # JetStream answered (not found, wrong revision...): the caller decides what that means
    except (TimeoutError, nats.errors.TimeoutError):
        raise BusTimeout(f"{what} timed out") from None
    except nats.errors.NoRespondersError:
        raise BusNoResponders(f"{what}: no JetStream answered") from None
    except nats.errors.Error as e:
        if isinstance(e, BusError):
            raise
        raise BusError(f"{what} failed: {type(e).__name__}: {e}") from None


def ack_error(r: dict[str, Any] | BaseException, what: str) -> BusError | None:
    """None for a stored message's ack, else the BusError its reply or exception means."""
    if isinstance(r, dict):
        if "error" not in r:
            return None
        e = r["error"]
        cls = BusStoreFull if store_full(e.get("err_code"), str(e.get("description", ""))) else BusError
        return cls(f"{what} failed: {e.get('description', e)} (err_code {e.get('err_code')})")
    if isinstance(r, nats.errors.NoRespondersError):
        return BusNoResponders(f"no stream stores {what.rsplit(' ', 1)[-1]}")
    if isinstance(r, TimeoutError | nats.errors.TimeoutError):
        return BusTimeout(f"{what} timed out")
    if isinstance(r, BusError):
        return r
    return BusError(f"{what} failed: {r}")
