"""MIG profile tables: which profiles a model has, an instance's profile from its name, memory and compute."""

from __future__ import annotations

import pytest

from gpuevents.mig import instance_profile, profiles_of


@pytest.mark.parametrize(("model", "names"), [
    ("NVIDIA A100-SXM4-40GB", ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("NVIDIA A100-SXM4-80GB", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("NVIDIA A30", ["1g.6gb", "2g.12gb", "4g.24gb"]),
    ("NVIDIA H100 80GB HBM3", ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("NVIDIA H100 NVL", ["1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"]),
    ("NVIDIA H200", ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
    ("NVIDIA GH200 480GB", ["1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"]),
    ("NVIDIA B200", ["1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
])
def test_each_mig_capable_model_has_its_guides_profiles(model: str, names: list[str]) -> None:
    assert [p.name for p in profiles_of(model)] == names


def test_a_model_without_mig_has_no_profiles() -> None:
    assert profiles_of("NVIDIA L4") == ()
    assert profiles_of("Tesla T4") == ()
    assert profiles_of(None) == ()


def test_an_instance_names_its_profile_and_its_share_of_the_compute() -> None:
    p = instance_profile("NVIDIA A100-SXM4-40GB MIG 3g.20gb")
    assert p is not None
    assert (p.compute_slices, p.total_slices) == (3, 7)
    assert p.compute_share == pytest.approx(3 / 7)
    a30 = instance_profile("NVIDIA A30 MIG 2g.12gb")
    assert a30 is not None and a30.compute_share == pytest.approx(0.5)
    assert instance_profile("NVIDIA A100-SXM4-40GB") is None
    assert instance_profile("NVIDIA A100-SXM4-40GB MIG 9g.99gb") is None  # no such profile: not guessed


def test_usable_memory_is_a_little_under_the_nominal_size() -> None:
    p = next(p for p in profiles_of("NVIDIA A100-SXM4-40GB") if p.name == "1g.5gb")
    # NVML reports 4,864 MiB for a 1g.5gb instance; the table must not promise more than that.
    assert 4_400 < p.memory_mib < 4_864
