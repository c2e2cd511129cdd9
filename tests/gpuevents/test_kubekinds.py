"""The Kubernetes kinds table: an ownerReference's kind found with its plural and how it pauses, another version
of a known kind keeping both, an unknown CRD a guessed plural and no pause; job ids split back."""

from __future__ import annotations

import pytest

from gpuevents.kubekinds import KINDS, Kind, job_id, kind_of, split_job_id


def test_a_known_kind_comes_with_its_plural_and_its_pause() -> None:
    assert kind_of("batch/v1", "Job") == Kind("batch", "v1", "Job", "jobs", "suspend")
    assert kind_of("v1", "Pod").api_version == "v1"
    assert kind_of("kubeflow.org/v1", "PyTorchJob").pause == "run_policy"
    assert kind_of("apps/v1", "DaemonSet").pause is None


def test_another_version_of_a_known_kind_keeps_its_plural_and_pause() -> None:
    assert kind_of("ray.io/v1alpha1", "RayJob") == Kind("ray.io", "v1alpha1", "RayJob", "rayjobs", "suspend")


def test_a_kind_of_the_same_name_in_another_group_is_not_taken_for_the_known_one() -> None:
    service = kind_of("serving.knative.dev/v1", "Service")
    assert service.plural == "services" and service.group == "serving.knative.dev"
    other = kind_of("example.com/v1", "Job")
    assert other == Kind("example.com", "v1", "Job", "jobs", None)


def test_an_unknown_crd_gets_a_guessed_plural_and_no_pause() -> None:
    assert kind_of("example.com/v2", "Sweep") == Kind("example.com", "v2", "Sweep", "sweeps", None)
    assert kind_of("example.com/v2", "Sweep").api_version == "example.com/v2"


def test_every_entry_is_keyed_by_its_own_kind() -> None:
    assert all(k.kind == name and k.plural == k.plural.lower() for name, k in KINDS.items())


@pytest.mark.parametrize(("job", "parts"), [
    ("ml/Deployment/train", ("ml", "Deployment", "train")), ("12345", None), ("ml/train-0", None),
    ("ml//train", None), ("a/b/c/d", None),
])
def test_a_job_id_splits_back_into_namespace_kind_and_name(job: str, parts: tuple[str, str, str] | None) -> None:
    assert split_job_id(job) == parts
    if parts is not None:
        assert job_id(*parts) == job
