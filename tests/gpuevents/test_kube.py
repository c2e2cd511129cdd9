"""The shared Kubernetes client factory: a configuration it cannot read is one clear error; one it can reaches a
real API server."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightkube.resources.core_v1 import Node

from gpuevents.config import KubernetesConfig
from gpuevents.kube import KubeConfigError, make_client
from tests.kube_cluster import KubeCluster


def test_an_unreadable_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(KubeConfigError, match="kubernetes configuration"):
        make_client(KubernetesConfig(kubeconfig=bad, context="nowhere"))


async def test_the_client_reaches_a_real_api_server_with_the_kubeconfigs_client_certificate(
        kube_cluster: KubeCluster) -> None:
    name = kube_cluster.unique("gpu")
    kube_cluster.add_gpu_node(name, gpus=4)
    client = make_client(KubernetesConfig(kubeconfig=kube_cluster.kubeconfig))
    try:
        node = await client.get(Node, name)
    finally:
        await client.close()
    assert node.status is not None and node.status.allocatable is not None
    assert node.status.allocatable["nvidia.com/gpu"] == "4"
