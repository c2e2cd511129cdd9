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
    except nats.js.errors.APIError:
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
        return BusError(f"{what} failed: {e.get('description', e)} (err_code {e.get('err_code')})")
    if isinstance(r, nats.errors.NoRespondersError):
        return BusNoResponders(f"no stream stores {what.rsplit(' ', 1)[-1]}")
    if isinstance(r, TimeoutError | nats.errors.TimeoutError):
        return BusTimeout(f"{what} timed out")
    if isinstance(r, BusError):
        return r
    return BusError(f"{what} failed: {r}")
