"""The registry: `rules check` reads every action's parameters from its light spec without importing a runtime
(no HTTP, Slack, Kubernetes, Apprise or NATS library); each built-in's runtime is its spec's subclass, loaded when
the action first runs; a runtime that will not load fails that action, not the runner."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar, Literal

import pytest

from actions import registry
from actions.protocol import Action, ActionParams
from actions.runner import ActionRunner
from tests.actions.conftest import make_config, make_request

#: what a runtime imports and a check must not
HEAVY = ("aiohttp", "slack_sdk", "lightkube", "apprise", "grpclib", "nats", "aiosmtplib", "httpx", "httpx2")

#: one rule per built-in type, each with parameters its model checks
EVERY_ACTION = """
rules:
  - name: every-action
    entity: gpu
    when: gpu.idle
    for: 1h
    actions:
      - {type: log, message: "idle {{ gpu.index }}"}
      - {type: slack, to: "{{ gpu.owner }}", text: "idle", buttons: {keep: [4h]}}
      - {type: kill, signal: TERM, grace: 30s}
      - {type: cordon, provider: slurm}
      - {type: scale, name: web, replicas: 0}
      - {type: webhook, url: "https://hooks.example/{{ node.name }}"}
      - {type: command, argv: [/bin/true, "{{ node.name }}"]}
      - {type: publish, subject: gpuevents.evt.custom.idle}
      - {type: function, name: acme.preempt}
      - {type: report, to: "#gpu-fleet"}
      - {type: email, to: "{{ gpu.owner }}", subject: "idle GPU", text: "idle"}
      - {type: notify, to: teams, text: "idle {{ gpu.index }}"}
      - {type: cancel}
      - {type: pause}
      - {type: drain, timeout: 10m}
    on_resolve:
      - {type: uncordon, provider: slurm}
      - {type: resume}
"""

CHECK = textwrap.dedent("""
    import json, sys
    from gpuevents.cli import main
    sys.argv = ["gpuevents", "rules", "check", *sys.argv[1:]]
    try:
        main()
    except SystemExit:
        pass
    print(json.dumps(sorted(sys.modules)), file=sys.stderr)
""")


def _check(*files: Path) -> tuple[str, set[str]]:
    """`gpuevents rules check FILES` in a fresh interpreter: (its output, the top-level packages it imported)."""
    done = subprocess.run([sys.executable, "-c", CHECK, *map(str, files)], capture_output=True, text=True,
                          timeout=120, check=False)
    *_, modules = done.stderr.strip().splitlines()
    return done.stdout, {m.split(".")[0] for m in json.loads(modules)}


def test_rules_check_reads_every_action_without_importing_a_runtime(tmp_path: Path) -> None:
    rules = tmp_path / "every.yaml"
    rules.write_text(EVERY_ACTION)
    out, imported = _check(rules)
    assert out.strip() == "ok: 1 rule(s) in 1 file(s)"
    assert sorted(imported & set(HEAVY)) == []


def test_rules_check_still_finds_bad_parameters_with_the_spec_alone(tmp_path: Path) -> None:
    rules = tmp_path / "bad.yaml"
    rules.write_text(EVERY_ACTION.replace("grace: 30s", "grace: soon").replace("replicas: 0", "replicas: -1"))
    out, imported = _check(rules)
    lines = out.splitlines()
    assert any(line.startswith(f"{rules}:10: ") and "grace" in line for line in lines), out
    assert any(line.startswith(f"{rules}:12: ") and "replicas must be 0 or more" in line for line in lines), out
    assert sorted(imported & set(HEAVY)) == []


@pytest.mark.parametrize("type_", registry.types())
def test_each_runtime_is_its_specs_subclass_and_runs(type_: str) -> None:
    spec, runtime = registry.get(type_), registry.runtime(type_)
    assert issubclass(runtime, spec)
    assert runtime.run is not Action.run, f"{runtime.__name__} does not implement run"
    assert (runtime.type, runtime.params, runtime.destructive, runtime.unit) == (
        spec.type, spec.params, spec.destructive, spec.unit)


def test_the_built_in_specs_import_no_runtime() -> None:
    """Each spec module on its own, in a fresh interpreter: the light half stays light."""
    code = ("import importlib, json, sys\n"
            "for m in sys.argv[1:]: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code, *registry.BUILTIN_MODULES], capture_output=True, text=True,
                          timeout=120, check=True)
    imported = set(json.loads(done.stdout))
    assert sorted({m.split(".")[0] for m in imported} & set(HEAVY)) == []
    assert sorted(m for m in imported if m.startswith("actions.builtin")) == []


class _BrokenParams(ActionParams):
    type: Literal["broken-runtime-test"] = "broken-runtime-test"


class _BrokenSpec(Action[_BrokenParams]):
    type: ClassVar[str] = "broken-runtime-test"
    params = _BrokenParams
    runtime: ClassVar[str | None] = "tests.actions.test_registry:_NotASubclass"


class _NotASubclass(Action[_BrokenParams]):
    type: ClassVar[str] = "broken-runtime-test"
    params = _BrokenParams


async def test_a_runtime_that_is_not_its_specs_subclass_fails_the_action_not_the_runner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry.load()
    monkeypatch.setattr(registry, "_registry", {**registry._registry, "broken-runtime-test": _BrokenSpec})
    with pytest.raises(TypeError, match="is not a subclass of _BrokenSpec"):
        registry.runtime("broken-runtime-test")
    runner = await ActionRunner.open(None, make_config())
    record = await runner.process(make_request("broken-runtime-test", {}))
    assert record.outcome == "failed"
    assert record.error is not None and record.error.startswith("cannot load the runtime of broken-runtime-test: "
                                                                "TypeError: the runtime of action")
    ok = await runner.process(make_request("log", {"message": "still running"}))
    assert (ok.outcome, ok.detail) == ("ok", "still running")
    # named, the rest loaded
    assert (await ActionRunner.open(None, make_config())).load_runtimes() == ["broken-runtime-test"]
