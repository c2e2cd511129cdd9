"""The shared Kubernetes client factory: a configuration it cannot read is one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuevents.config import KubernetesConfig
from gpuevents.kube import KubeConfigError, make_client


def test_an_unreadable_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    with pytest.raises(KubeConfigError, match="kubernetes configuration"):
        make_client(KubernetesConfig(kubeconfig=bad, context="nowhere"))
