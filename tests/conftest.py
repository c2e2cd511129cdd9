"""Shared fixtures: a real nats-server on a free loopback port with a temporary store; the `slow` marking and the
quick hypothesis profile of `pytest -m "not slow"`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest
from hypothesis import HealthCheck, settings
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext

from gpuevents.bus import Bus, StoredMsg
from gpuevents.config import EmbeddedServerConfig, NatsConfig
from gpuevents.server import EmbeddedServer
from tests.quick import QUICK_EXAMPLES, set_quick

# Tests that use one of these fixtures start a real cluster (seconds to a minute each): marked `slow`.
SLOW_FIXTURES = frozenset({"slurm", "nats_cluster", "kube_cluster"})


# No test fails on timing: hypothesis' per-example deadline and its "too slow" health check do, on a loaded machine.
UNTIMED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pytest_configure(config: pytest.Config) -> None:
    """`-m "not slow"` or GPUEVENTS_QUICK=1 is the quick loop: hypothesis runs fewer examples."""
    if os.environ.get("GPUEVENTS_QUICK") == "1" or "not slow" in (config.option.markexpr or ""):
        set_quick(True)
        settings.register_profile("quick", UNTIMED, max_examples=QUICK_EXAMPLES)
        settings.load_profile("quick")
    else:
        settings.register_profile("full", UNTIMED)
        settings.load_profile("full")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A running nats-server with JetStream; `.stop()` and `.start()` keep its port and store."""
    server = EmbeddedServer(
        EmbeddedServerConfig(host="127.0.0.1", port=0, data_dir=tmp_path / "nats"),
        log_file=tmp_path / "nats.log",
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def nats_config(nats_server: EmbeddedServer) -> NatsConfig:
    return NatsConfig(url=nats_server.url, reconnect_wait=0.2, connect_timeout=2, publish_timeout=2)


@pytest.fixture
async def bus(nats_config: NatsConfig) -> AsyncIterator[Bus]:
    """A connected bus with the streams and KV bucket created."""
    b = Bus(nats_config, name="test")
    await b.connect()
    await b.ensure_streams()
    try:
        yield b
    finally:
        await b.close(flush_timeout=1)


@pytest.fixture
async def nats_client(nats_server: EmbeddedServer) -> AsyncIterator[NatsClient]:
    """A plain nats-py client on the test server, for tests that look behind the bus (consumer state, stored
    messages, pull requests) without reaching into its internals."""
    nc = await nats.connect(servers=[nats_server.url])
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
def jetstream(nats_client: NatsClient) -> JetStreamContext:
    return nats_client.jetstream()


class PullRequests:
    """Counts the pull requests a nats-py client sends to one durable consumer (a listener on their subject
    would answer them in the server's eyes, hiding the 503 a deleted consumer gives: so the client's publish
    is wrapped instead)."""

    def __init__(self) -> None:
        self.count = 0

    @classmethod
    def watch(cls, nc: NatsClient, stream: str, durable: str, monkeypatch: pytest.MonkeyPatch) -> PullRequests:
        counter = cls()
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        publish = nc.publish

        async def counted(subj: str, *args: Any, **kwargs: Any) -> None:
            if subj == subject:
                counter.count += 1
            await publish(subj, *args, **kwargs)

        monkeypatch.setattr(nc, "publish", counted)
        return counter


async def stored_messages(js: JetStreamContext, stream: str, limit: int = 10_000) -> list[StoredMsg]:
    """The messages `stream` holds now, read one by one (any retention, work queues included)."""
    state = (await js.stream_info(stream)).state
    out: list[StoredMsg] = []
    for seq in range(state.first_seq, min(state.last_seq, state.first_seq + limit - 1) + 1):
        try:
            m = await js.get_msg(stream, seq)
        except nats.js.errors.NotFoundError:
            continue
        out.append(StoredMsg(m.subject or "", m.data or b"", seq, None))
    return out


from tests.kube_cluster import kube_cluster  # noqa: E402, F401 - a fixture: a real Kubernetes control plane
from tests.nats_cluster import nats_cluster  # noqa: E402, F401 - a fixture: three nats-servers as one cluster
from tests.pending import no_pending_tasks  # noqa: E402, F401 - autouse: a test that leaves asyncio tasks fails
from tests.slurm_cluster import slurm  # noqa: E402, F401 - a fixture: a real Slurm on loopback
