"""A port someone else holds: one line naming the option to change, never a traceback (two engines or agents on
one host)."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator


class PortInUse(Exception):
    """A configured port could not be bound; the message names the option and what to do."""


@contextlib.contextmanager
def binding(option: str, addr: str, port: int) -> Iterator[None]:
    """Bind inside this block; a port in use (or not ours to bind) becomes PortInUse naming `option`."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.EADDRINUSE, errno.EACCES, errno.EADDRNOTAVAIL):
            raise
        env = "GPUEVENTS_" + option.upper().replace(".", "__")
        why = ("is in use (another gpuevents on this host?)" if e.errno == errno.EADDRINUSE
               else f"cannot be bound ({e.strerror})")
        raise PortInUse(f"{option}: {addr}:{port} {why}; set {option} ({env}) to a free port, or null to turn "
                        "it off") from None
