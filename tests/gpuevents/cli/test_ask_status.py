"""`gpuevents.cli.ask_status` and the client commands around it (`status`, `free`, `job`, `jobs`): they read the
engine's replies with the models of gpuevents/wire alone, never importing the engine or the dashboard (rules/)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import orjson
import pytest

from gpuevents.bus import Bus
from gpuevents.config import Config
from tests.gpuevents.cli.test_client import write_config
from tests.test_layers import ROOT, tree_imports

CLIENTS = {  # a client module -> where the models it sends and reads are (None: it reads a local store)
    "gpuevents.cli.client": "gpuevents.wire", "gpuevents.cli.ask_status": "gpuevents.wire",
    "gpuevents.cli.free": "gpuevents.wire", "gpuevents.cli.manual": "gpuevents.wire.manual", "gpuevents.cli.jobs": None}
ENGINE_SIDE = ("rules.engine", "rules.dashboard")  # where the servers build the replies


def reached(start: str, graph: dict[str, set[str]]) -> dict[str, str]:
    """Every module `start` imports, directly or not (lazy and TYPE_CHECKING imports included), each with the
    module that imports it."""
    via: dict[str, str] = {}
    todo = [start]
    while todo:
        here = todo.pop()
        for target in graph.get(here, ()):
            if target not in via and target != start:
                via[target] = here
                todo.append(target)
    return via


def chain(module: str, via: dict[str, str]) -> str:
    path = [module]
    while path[-1] in via:
        path.append(via[path[-1]])
    return " <- ".join(path)


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_client_command_imports_nothing_of_the_engine_or_the_dashboard(client: str) -> None:
    graph = tree_imports(ROOT, strings=False)
    assert client in graph
    via = reached(client, graph)
    wire = CLIENTS[client]
    assert wire is None or any(m == wire or m.startswith(wire + ".") for m in via), sorted(via)
    engine_side = [chain(m, via) for m in via if m.startswith(ENGINE_SIDE)]
    assert engine_side == []


def test_the_reached_check_sees_a_lazy_import() -> None:
    """The check follows imports inside functions: the server side, which builds the replies, is reached."""
    graph = tree_imports(ROOT, strings=False)
    assert "rules.engine.read.status" in reached("rules.engine.servers", graph)
    assert "gpuevents.wire.status" in reached("rules.engine.servers", graph)


PROBE = """
import sys
from typer.testing import CliRunner
from gpuevents.cli import app
results = [(args[0], *(lambda r: (r.exit_code, r.output))(CliRunner().invoke(app, args))) for args in {runs!r}]
loaded = sorted(m for m in sys.modules if m.startswith({engine_side!r}))
print(__import__("orjson").dumps({{"results": results, "loaded": loaded}}).decode())
"""


async def test_asking_with_no_engine_runs_the_client_path_without_loading_the_engine(
        engine_config: Config, bus: Bus, tmp_path: Path) -> None:
    """A fresh interpreter runs `status`, `status --all`, `status --node`, `free` and `jobs` against a real
    nats-server with no engine on it: each says so, and nothing of rules/engine or rules/dashboard was loaded."""
    await bus.ensure_streams()
    cfg = str(write_config(engine_config, tmp_path / "c.yaml"))
    runs = [["status", "-c", cfg], ["status", "--all", "-c", cfg], ["status", "--node", "n1", "-c", cfg],
            ["free", "-c", cfg], ["jobs", "-c", cfg]]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBE.format(runs=runs, engine_side=ENGINE_SIDE), cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    found = orjson.loads(out.splitlines()[-1])
    for (verb, code, output), args in zip(found["results"], runs, strict=True):
        if verb == "jobs":
            assert code == 1 and "usage" in output, output  # no usage store in this config: it says so
        else:
            assert code == 1 and "no engine answer" in output, (args, output)
    assert found["loaded"] == []
