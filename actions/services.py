"""What actions share while a runner lives: the bus, the KV store, the clock, an HTTP session, a Kubernetes client,
and what the composition root hands in from the rest of the tree (the weekly usage summary)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from actions.errors import PermanentError
from actions.store import KeyValue, MemoryKv
from gpuevents.clock import Clock, SystemClock
from gpuevents.config import Config

if TYPE_CHECKING:
    import aiohttp
    from lightkube import AsyncClient
    from slack_sdk.web.async_client import AsyncWebClient

    from gpuevents.bus import Bus

WeeklySummary = Callable[[Config, datetime, str | None, int], str | None]
"""`(config, now, team, top_jobs)`: the week's usage up to `now` for `team` (None: the whole fleet) as Slack
mrkdwn listing up to `top_jobs` idle jobs; None when that team recorded nothing; LookupError when nothing
was recorded at all. The visibility code builds it from the rollups store; actions never import it."""


def slack_client(config: Config, token: str | None, *, sdk_retries: bool = False) -> AsyncWebClient:
    """The Slack Web API client every Slack caller uses: `actions.slack.base_url` (tests, proxies) or Slack's,
    the actions' timeout; slack-sdk's own retries off unless asked for (the runner retries actions itself)."""
    from slack_sdk.web.async_client import AsyncWebClient

    base = config.actions.slack.base_url or AsyncWebClient.BASE_URL
    extra: dict[str, Any] = {} if sdk_retries else {"retry_handlers": []}
    return AsyncWebClient(token=token, base_url=base if base.endswith("/") else base + "/",
                          timeout=int(config.actions.timeout), **extra)


class Services:
    """What the runner shares with its actions, as `ctx.services`; created by the runner, closed with it.

    Named and typed: `bus` (PermanentError when the runner has none), `kv`, `clock`, `report` (the weekly usage
    summary the composition root hands in), `http()` and `kube()` (made on first use: an action that needs
    neither never imports aiohttp or lightkube), `cache` (per-action state that outlives one run)."""

    def __init__(self, config: Config, bus: Bus | None = None, kv: KeyValue | None = None,
                 clock: Clock | None = None, report: WeeklySummary | None = None) -> None:
        self.config = config
        self._bus = bus
        self._report = report
        self.kv: KeyValue = kv if kv is not None else MemoryKv()
        self.clock: Clock = clock or SystemClock()
        self._http: aiohttp.ClientSession | None = None
        self._kube: AsyncClient | None = None
        self.cache: dict[str, Any] = {}  # per-action caches (e.g. Slack handles), keyed by action type

    @property
    def bus(self) -> Bus:
        if self._bus is None:
            raise PermanentError("this action needs the NATS bus, and the runner has none")
        return self._bus

    @property
    def has_bus(self) -> bool:
        return self._bus is not None

    @property
    def report(self) -> WeeklySummary:
        if self._report is None:
            raise PermanentError("this action needs the weekly usage summary, and the runner has none "
                                 "(the engine's runners have it)")
        return self._report

    def http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http

    def kube(self) -> AsyncClient:
        if self._kube is None:
            from actions.kube import make_client

            self._kube = make_client(self.config.actions.kubernetes)
        return self._kube

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._kube is not None:
            await self._kube.close()
            self._kube = None


class _HasServices(Protocol):
    @property
    def services(self) -> Services: ...


def services_of(ctx: _HasServices) -> Services:
    """`ctx.services`, for plugins written before it was typed (they called this)."""
    return ctx.services
