"""The agent's Kubernetes sections: the defaults a node needs (the service account's token, the kubelet's
PodResources socket, GPUs and MIG slices as resources), durations as written, unknown keys refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpuevents.config.kube import KubeletConfig, KubernetesJobsConfig, PodResourcesConfig


def test_the_defaults_are_those_of_a_pod_on_a_kubelet() -> None:
    assert KubeletConfig().url is None
    assert KubeletConfig().token_file == Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    pr = PodResourcesConfig()
    assert pr.enabled is None and pr.socket == Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    assert pr.resources == ["nvidia.com/gpu", "nvidia.com/mig-"] and (pr.refresh, pr.timeout) == (10.0, 5.0)
    assert KubernetesJobsConfig().owner_cache == 300.0


def test_durations_are_read_as_written() -> None:
    assert KubeletConfig.model_validate({"refresh": "2m"}).refresh == 120.0
    assert KubernetesJobsConfig.model_validate({"owner_cache": "1h"}).owner_cache == 3600.0


def test_an_unknown_key_or_a_bad_duration_is_refused_and_sections_are_frozen() -> None:
    with pytest.raises(ValidationError, match="sockett"):
        PodResourcesConfig.model_validate({"sockett": "/x"})
    with pytest.raises(ValidationError, match="duration like 2h"):
        KubeletConfig.model_validate({"refresh": "soon"})
    with pytest.raises(ValidationError, match="frozen"):
        KubeletConfig().url = "https://127.0.0.1:10250"  # type: ignore[misc]  # frozen: it must raise
