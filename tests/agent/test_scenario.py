"""Scenario files for the simulated sampler: every shipped one loads; spans, durations and MIG layouts are read
and checked; a file that is wrong says where (`file:line`), an unknown name lists the shipped ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.scenario import GpuModel, MigLayout, Scenario, load_scenario, profile_mem_mib, shipped_scenarios, slices
from gpuevents.yamlpos import LocatedError


@pytest.mark.parametrize("name", shipped_scenarios())
def test_every_shipped_scenario_loads(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name and (scenario.jobs or scenario.pinned)


def test_spans_and_durations_are_read_as_written(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: s\ngap: [1m, 2h]\njobs:\n  - kind: training\n    duration: 90s\n    util_pct: [80, 99]\n"
                 "  - kind: idle_holder\n    weight: 3\n    blip_every: 10m\n")
    s = load_scenario(f)
    assert s.gap == (60.0, 7200.0)
    training = s.mix("training")
    assert training is not None and (training.duration, training.util_pct) == ((90.0, 90.0), (80.0, 99.0))
    holder = s.mix("idle_holder")
    assert holder is not None and (holder.weight, holder.blip_every) == (3.0, 600.0)
    assert s.mix("ghost") is None


def test_a_wrong_scenario_says_where(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text("name: s\njobs:\n  - kind: training\n    util_pct: [99, 80]\n")
    with pytest.raises(LocatedError, match=r"s\.yaml:4: .*low 99(\.0)? is above high 80"):
        load_scenario(f)
    f.write_text("name: s\n")
    with pytest.raises(LocatedError, match="a scenario needs `jobs` or `pinned`"):
        load_scenario(f)
    f.write_text("- name: s\n")
    with pytest.raises(LocatedError, match="a scenario is a mapping"):
        load_scenario(f)


def test_an_unknown_name_lists_the_shipped_scenarios() -> None:
    with pytest.raises(LocatedError, match=r"no such scenario; shipped: .*demo.*mixed"):
        load_scenario("no-such-scenario")


def test_a_pinned_busy_job_needs_its_utilization_from_somewhere() -> None:
    with pytest.raises(ValueError, match="pinned training job on gpu 1 needs util_pct"):
        Scenario.model_validate({"name": "s", "pinned": [{"gpu": 1, "kind": "training"}]})
    ok = Scenario.model_validate({"name": "s", "pinned": [{"gpu": 1, "kind": "training", "util_pct": 90}]})
    assert ok.pinned[0].util_pct == (90.0, 90.0)


def test_mig_profiles_are_checked_and_must_fit_seven_slices() -> None:
    assert (slices("3g.40gb"), profile_mem_mib("1g.10gb")) == (3, 10 * 1024 - 256)
    assert MigLayout(gpus=[0], profiles=["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]).profiles[0] == "3g.40gb"
    with pytest.raises(ValueError, match="need more than the 7 compute slices"):
        MigLayout(gpus=[0], profiles=["4g.40gb", "4g.40gb"])
    with pytest.raises(ValueError, match="is not a MIG profile"):
        MigLayout(gpus=[0], profiles=["half"])


def test_gpm_comes_from_the_model_name_unless_set() -> None:
    assert GpuModel().has_gpm  # H100
    assert GpuModel(name="NVIDIA GB200").has_gpm
    assert not GpuModel(name="NVIDIA A100-SXM4-80GB").has_gpm
    assert GpuModel(name="NVIDIA A100-SXM4-80GB", gpm=True).has_gpm
