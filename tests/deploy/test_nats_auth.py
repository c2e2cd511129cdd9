"""deploy/nats/nats_auth.py: the files it writes, rerun behaviour, and the configs nats-server accepts."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import kubernetes_validate
import pytest
import yaml

from gpuevents.server import find_binary
from tests.deploy.conftest import DEPLOY, NODES

K8S_VERSION = "1.33"


def test_rerun_keeps_passwords_and_revokes_removed_nodes(nats_auth: ModuleType, tmp_path: Path) -> None:
    first = nats_auth.generate("c1", ["n1", "n2"], tmp_path)
    second = nats_auth.generate("c1", ["n1", "n3"], tmp_path)
    assert second.engine_password == first.engine_password
    assert second.agent_passwords["n1"] == first.agent_passwords["n1"]
    assert set(second.agent_passwords) == {"n1", "n3"}
    auth = (tmp_path / "auth.conf").read_text()
    assert '"agent/c1/n2"' not in auth and first.agent_passwords["n2"] not in auth
    assert not (tmp_path / "passwords" / "agents" / "n2").exists()
    assert not (tmp_path / "env" / "agent-n2.env").exists()
    assert (tmp_path / "env" / "agent-n3.env").read_text() == (
        f"NATS_USER=agent/c1/n3\nNATS_PASSWORD={second.agent_passwords['n3']}\n"
    )


def test_every_written_file_is_private(nats_auth: ModuleType, tmp_path: Path) -> None:
    nats_auth.generate("c1", NODES, tmp_path)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    # auth.conf, kubernetes-secrets.yaml, a password and an env file per role, two per node
    assert len(files) == 2 + 2 * len(nats_auth.ROLE_USERS) + 2 * len(NODES)
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o600"}
    dirs = [p for p in tmp_path.rglob("*") if p.is_dir()]
    assert {oct(p.stat().st_mode & 0o777) for p in dirs} == {"0o700"}


def test_passwords_are_long_and_distinct(nats_auth: ModuleType, tmp_path: Path) -> None:
    result = nats_auth.generate("c1", NODES, tmp_path)
    passwords = [*result.role_passwords.values(), *result.agent_passwords.values()]
    assert len(set(passwords)) == len(passwords)
    assert min(len(p) for p in passwords) >= 40


@pytest.mark.parametrize("bad", ["", "a b", "../etc", "node/x", "-x", "ü"])
def test_node_names_that_cannot_be_file_names_or_secret_keys_are_refused(
    nats_auth: ModuleType, tmp_path: Path, bad: str
) -> None:
    with pytest.raises(ValueError, match="node name"):
        nats_auth.generate("c1", ["ok", bad], tmp_path)


def test_cli_reads_node_names_from_kubectl_output(
    nats_auth: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("node/gpu-01\nnode/gpu-02  # rack 4\n\n"))
    assert nats_auth.main(["--cluster", "prod-a", "--out", str(tmp_path), "--nodes-file", "-"]) == 0
    assert sorted(p.name for p in (tmp_path / "passwords" / "agents").iterdir()) == ["gpu-01", "gpu-02"]
    assert "2 agents" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "env").iterdir()) == [
        "admin.env", "agent-gpu-01.env", "agent-gpu-02.env", "engine.env", "operator.env", "runner.env"]


def test_cli_without_nodes_says_so(nats_auth: ModuleType, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert nats_auth.main(["--cluster", "c1", "--out", str(tmp_path)]) == 2
    assert "no nodes given" in capsys.readouterr().err


def test_example_auth_conf_is_what_the_generator_writes(nats_auth: ModuleType) -> None:
    example = (DEPLOY / "nats" / "auth.example.conf").read_text()
    body = example.split("\n", 1)[1]  # after the one line that says it is an example
    assert body == nats_auth.render_auth_conf(
        "prod-a", {r: f"<{r} password>" for r in nats_auth.ROLE_USERS},
        {"gpu-01": "<gpu-01 password>", "gpu-02": "<gpu-02 password>"},
    )


def test_nats_server_accepts_the_bare_metal_config_with_the_generated_users(
    nats_auth: ModuleType, tmp_path: Path
) -> None:
    nats_auth.generate("c1", NODES, tmp_path / "out")
    shutil.copy(DEPLOY / "nats" / "nats-server.conf", tmp_path / "nats-server.conf")
    shutil.copy(tmp_path / "out" / "auth.conf", tmp_path / "auth.conf")
    check = subprocess.run(
        [str(find_binary()), "-c", str(tmp_path / "nats-server.conf"), "-t"],
        capture_output=True, text=True, timeout=30, env={"NATS_SERVER_NAME": "nats-1"},
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "is valid" in check.stdout + check.stderr


def test_kubernetes_secrets_hold_every_password_and_pass_the_schema(
    nats_auth: ModuleType, tmp_path: Path
) -> None:
    result = nats_auth.generate("c1", NODES, tmp_path)
    docs = list(yaml.safe_load_all((tmp_path / "kubernetes-secrets.yaml").read_text()))
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    by_name = {d["metadata"]["name"]: d for d in docs}
    assert by_name[nats_auth.NATS_AUTH_SECRET]["metadata"]["namespace"] == "nats"
    assert by_name[nats_auth.NATS_AUTH_SECRET]["stringData"]["auth.conf"] == (
        (tmp_path / "auth.conf").read_text()
    )
    assert by_name[nats_auth.AGENT_SECRET]["stringData"] == result.agent_passwords
    assert by_name[nats_auth.ENGINE_SECRET]["stringData"] == {"nats-password": result.engine_password}
    assert by_name[nats_auth.ROLES_SECRET]["stringData"] == {
        r: p for r, p in result.role_passwords.items() if r != "engine"}
