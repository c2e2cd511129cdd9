"""`binding`: a bind that fails because the port is taken says which option to change; other errors pass."""

from __future__ import annotations

import socket

import pytest

from gpuevents.ports import PortInUse, binding


def test_a_taken_port_names_the_option_and_its_variable() -> None:
    with socket.socket() as taken, socket.socket() as second:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse) as e, binding("agent.metrics_port", "127.0.0.1", port):
            second.bind(("127.0.0.1", port))
    assert str(e.value) == (f"agent.metrics_port: 127.0.0.1:{port} is in use (another gpuevents on this host?); "
                            "set agent.metrics_port (GPUEVENTS_AGENT__METRICS_PORT) to a free port, or null to "
                            "turn it off")


def test_other_errors_are_not_taken_for_a_port_in_use() -> None:
    with pytest.raises(FileNotFoundError), binding("engine.metrics_port", "127.0.0.1", 1):
        open("/nonexistent/file")
