"""Shared fixtures: a real nats-server on a free loopback port with a temporary store."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuevents.bus import Bus
from gpuevents.config import EmbeddedServerConfig, NatsConfig
from gpuevents.server import EmbeddedServer


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
