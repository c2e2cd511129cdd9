"""deploy/systemd: `systemd-analyze verify` where it exists, and the keys each unit must have, always."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.conftest import DEPLOY

UNITS = DEPLOY / "systemd"
CONFIG = "/etc/gpuevents/config.yaml"
HOST_UNIT_DIRS = (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system"))

Unit = dict[str, dict[str, list[str]]]


def parse_unit(path: Path) -> Unit:
    """Sections -> key -> every value (systemd keys may repeat); comments and blanks dropped."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None and "=" in line, f"{path.name}:{n}: not `Key=value`: {raw!r}"
        key, _, value = line.partition("=")
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}: expected one value, got {values}"
    return values[0]


def words(unit: Unit, section: str, key: str) -> set[str]:
    return {w for v in unit.get(section, {}).get(key, []) for w in v.split()}


def unit_files() -> list[Path]:
    return sorted(UNITS.glob("*.service"))


def check_common(unit: Unit, name: str) -> None:
    assert unit["Unit"]["Description"], name
    assert "network-online.target" in words(unit, "Unit", "After"), name
    assert words(unit, "Install", "WantedBy") == {"multi-user.target"}, name
    svc = unit["Service"]
    assert svc["Restart"][0] in ("always", "on-failure"), name
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "ProtectKernelModules",
                "ProtectKernelTunables", "ProtectControlGroups", "RestrictSUIDSGID"):
        assert one(unit, "Service", key) == "yes", f"{name}: {key}"
    assert one(unit, "Service", "ProtectSystem") == "strict", name
    assert "@system-service" in words(unit, "Service", "SystemCallFilter"), name


def check_agent(unit: Unit) -> None:
    check_common(unit, "agent")
    argv = shlex.split(one(unit, "Service", "ExecStart"))
    assert argv[1:] == ["agent", "-c", CONFIG]
    assert one(unit, "Service", "EnvironmentFile") == "/etc/gpuevents/agent.env"
    # signal other users' processes, read their /proc entries; nothing else
    assert words(unit, "Service", "AmbientCapabilities") == {"CAP_KILL", "CAP_SYS_PTRACE"}
    assert words(unit, "Service", "CapabilityBoundingSet") == {"CAP_KILL", "CAP_SYS_PTRACE"}
    assert one(unit, "Service", "DynamicUser") == "yes" or one(unit, "Service", "User") != "root"
    # what would blind it: hidden /dev/nvidia*, hidden processes, a private user namespace
    svc = unit["Service"]
    assert svc.get("PrivateDevices", ["no"]) == ["no"]
    assert svc.get("ProtectProc", ["default"]) == ["default"]
    assert svc.get("PrivateUsers", ["no"]) == ["no"]
    assert "DevicePolicy" not in svc


def check_engine(unit: Unit, verb: str = "engine") -> None:
    check_common(unit, verb)
    argv = shlex.split(one(unit, "Service", "ExecStart"))
    assert argv[1:] == [verb, "-c", CONFIG]
    assert one(unit, "Service", "EnvironmentFile") == "/etc/gpuevents/engine.env"
    assert one(unit, "Service", "DynamicUser") == "yes"
    assert one(unit, "Service", "CapabilityBoundingSet") == ""
    state = one(unit, "Service", "StateDirectory")
    assert one(unit, "Service", "WorkingDirectory") == f"/var/lib/{state}"
    assert one(unit, "Service", "PrivateDevices") == "yes"


def check_units() -> None:
    """The keys each unit needs, from the unit files alone (what runs where systemd-analyze is missing)."""
    names = {p.name for p in unit_files()}
    assert names == {"gpuevents-agent.service", "gpuevents-engine.service",
                     "gpuevents-runner@.service", "nats-server.service"}
    check_agent(parse_unit(UNITS / "gpuevents-agent.service"))
    check_engine(parse_unit(UNITS / "gpuevents-engine.service"))
    check_engine(parse_unit(UNITS / "gpuevents-runner@.service"), verb="runner")
    nats = parse_unit(UNITS / "nats-server.service")
    check_common(nats, "nats-server")
    assert shlex.split(one(nats, "Service", "ExecStart"))[1:] == ["-c", "/etc/nats/nats-server.conf"]
    assert one(nats, "Service", "User") == "nats"


def test_agent_unit_can_read_nvml_and_signal_processes_and_nothing_more() -> None:
    check_agent(parse_unit(UNITS / "gpuevents-agent.service"))


def test_engine_and_runner_units_run_unprivileged_with_their_own_state() -> None:
    check_engine(parse_unit(UNITS / "gpuevents-engine.service"))
    check_engine(parse_unit(UNITS / "gpuevents-runner@.service"), verb="runner")


def test_every_unit_has_the_keys_it_needs() -> None:
    check_units()


def test_the_agent_env_file_is_what_nats_auth_writes(nats_auth: ModuleType, tmp_path: Path) -> None:
    nats_auth.generate("c1", ["gpu-01"], tmp_path)
    keys = {line.split("=", 1)[0] for line in (tmp_path / "env" / "agent-gpu-01.env").read_text().splitlines()}
    assert keys == {"NATS_USER", "NATS_PASSWORD"}  # what gpuevents.bus reads


def _verify_root(tmp_path: Path) -> tuple[Path, list[str]]:
    """A root for `systemd-analyze verify --root`: the host's units, ours, stubs for our programs."""
    host_units = next((d for d in HOST_UNIT_DIRS if (d / "sysinit.target").exists()), None)
    assert host_units is not None, "systemd-analyze is installed but no systemd unit directory is"
    root = tmp_path / "root"
    shutil.copytree(host_units, root / "usr/lib/systemd/system", symlinks=True)
    ours = root / "etc/systemd/system"
    ours.mkdir(parents=True)
    targets = []
    for path in unit_files():
        shutil.copy(path, ours / path.name)
        unit = parse_unit(path)
        for key in ("ExecStart", "ExecReload"):
            for line in unit["Service"].get(key, []):
                program = Path(shlex.split(line)[0])
                stub = root / program.relative_to("/")
                stub.parent.mkdir(parents=True, exist_ok=True)
                stub.write_text("#!/bin/sh\n")
                stub.chmod(0o755)
        name = path.name.replace("@.service", "@1.service")
        targets.append(str(ours / name))
    return root, targets


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        # Not skipped: fall back to the structural checks, and say so.
        warnings.warn("systemd-analyze not found: checked the units' keys only, not `verify`",
                      stacklevel=1)
        check_units()
        return
    root, targets = _verify_root(tmp_path)
    result = subprocess.run([analyze, "verify", f"--root={root}", *targets],
                            capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values, but says so: any output is a finding
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), (
        result.stdout + result.stderr)


def test_verify_catches_a_misspelt_key(tmp_path: Path) -> None:
    """The check above would see a broken unit: guards against a verify that checks nothing."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        with pytest.raises(AssertionError):
            broken = tmp_path / "broken.service"
            broken.write_text((UNITS / "gpuevents-agent.service").read_text()
                              .replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"))
            check_agent(parse_unit(broken))
        return
    root, targets = _verify_root(tmp_path)
    agent = Path(targets[0])
    assert agent.name == "gpuevents-agent.service"
    agent.write_text(agent.read_text().replace("ProtectHome=yes", "ProtectHom=yes"))
    result = subprocess.run([analyze, "verify", f"--root={root}", str(agent)],
                            capture_output=True, text=True, timeout=60)
    assert "ProtectHom" in result.stdout + result.stderr
