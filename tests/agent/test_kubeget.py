"""The agent's own read-only API reader: kubeconfig credentials it can use (token, token file read again per
request as it rotates, client certificate), those it leaves to lightkube (credential plugins), and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.kubeget import KubeReader, KubeReadError, Unsupported, object_path
from tests.actions.conftest import kube, kubeconfig  # noqa: F401  (fixtures)
from tests.actions.fakes import FakeKubernetes, Injected


def write(path: Path, user: dict[str, object]) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_credential_plugins_are_left_to_lightkube_and_a_token_file_is_read_each_time(tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="credential plugin"):
        KubeReader._from_kubeconfig(write(tmp_path / "a", {"exec": {"command": "aws"}}), None)
    with pytest.raises(Unsupported, match="no context"):
        KubeReader._from_kubeconfig(write(tmp_path / "b", {"token": "t"}), "other")
    token = tmp_path / "token"
    token.write_text("first\n")
    r = KubeReader._from_kubeconfig(write(tmp_path / "c", {"tokenFile": str(token)}), None)
    assert r._headers()["Authorization"] == "Bearer first"
    token.write_text("rotated\n")
    assert r._headers()["Authorization"] == "Bearer rotated"
    assert object_path("apps", "v1", "deployments", "ns", "d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert object_path("", "v1", "namespaces", "", "ns") == "/api/v1/namespaces/ns"


async def test_reads_objects_404_as_none_and_errors_with_their_status(
        kube: FakeKubernetes, kubeconfig: Path) -> None:  # noqa: F811
    kube.add_node("n1")
    r = KubeReader._from_kubeconfig(kubeconfig, None)
    try:
        got = await r.get("/api/v1/nodes/n1")
        assert got is not None and got["metadata"]["name"] == "n1"
        assert await r.get("/api/v1/nodes/absent") is None
        kube.inject.append(Injected(403))
        with pytest.raises(KubeReadError) as e:
            await r.get("/api/v1/nodes/n1")
        assert e.value.code == 403
    finally:
        await r.close()
