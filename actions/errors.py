"""How an action says a run did not work: worth retrying, not worth it, or not now (re-exported by protocol)."""

from __future__ import annotations


class TransientError(Exception):
    """Worth retrying (a 5xx, a timeout, a lost connection); `delay` overrides the backoff."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(Exception):
    """Retrying will not help (a 4xx, an unknown user, a bad parameter)."""


class Deferred(Exception):
    """Not now: come back after `delay` seconds. Not a failure, not an attempt, not audited.

    The Slack digest uses it: the first message of a window waits for the window to close.
    """

    def __init__(self, delay: float, why: str = "") -> None:
        super().__init__(why or f"deferred for {delay:.0f}s")
        self.delay = delay
