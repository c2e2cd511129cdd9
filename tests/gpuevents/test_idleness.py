"""Idle rules: which signal decides, the power floor as a second signal, per GPU model, validated config."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuevents.config import ThresholdsConfig, load_config
from gpuevents.idleness import IdleRule, model_matches
from gpuevents.yamlpos import LocatedError

BY_MODEL = [
    {"model": "*A10G*", "signal": "utilization", "below": 5, "power_below_w": 100},
    {"model": "*h100*", "signal": "sm_active", "below": 3, "power_below_w": 150},
    {"model": "NVIDIA L4", "signal": "power", "below": 25},
]


def test_the_signal_below_its_threshold_is_idle() -> None:
    rule = IdleRule("sm_active", 3.0)
    assert rule.verdict(util_pct=100.0, sm_active_pct=1.0, power_w=400.0) is True  # busy-looking, SMs idle
    assert rule.verdict(util_pct=0.0, sm_active_pct=3.0, power_w=60.0) is False
    assert IdleRule("power", 25.0).verdict(None, None, 24.9) is True


def test_a_missing_signal_is_no_evidence() -> None:
    assert IdleRule("sm_active", 3.0).verdict(util_pct=0.0, sm_active_pct=None, power_w=60.0) is None
    assert IdleRule("power", 25.0).verdict(0.0, 0.0, None) is None


def test_power_as_second_signal_keeps_a_drawing_gpu_busy() -> None:
    rule = IdleRule("utilization", 5.0, power_below_w=150.0)
    assert rule.verdict(util_pct=1.0, sm_active_pct=None, power_w=149.0) is True
    assert rule.verdict(util_pct=1.0, sm_active_pct=None, power_w=310.0) is False
    assert rule.verdict(util_pct=1.0, sm_active_pct=None, power_w=None) is True  # unread: the first decides
    assert rule.verdict(util_pct=50.0, sm_active_pct=None, power_w=60.0) is False


def test_the_first_matching_model_glob_wins_case_insensitively() -> None:
    th = ThresholdsConfig.model_validate({"idle_util_pct": 7, "idle_by_model": BY_MODEL})
    assert th.idle_rule("NVIDIA H100 80GB HBM3") == IdleRule("sm_active", 3.0, 150.0)
    assert th.idle_rule("NVIDIA A10G") == IdleRule("utilization", 5.0, 100.0)
    assert th.idle_rule("NVIDIA L4") == IdleRule("power", 25.0)
    assert th.idle_rule("NVIDIA A100-SXM4-80GB") == IdleRule("utilization", 7.0)  # no entry: idle_util_pct
    assert th.idle_rule(None) == IdleRule("utilization", 7.0)
    assert model_matches("*H100*", "NVIDIA H100 80GB HBM3 MIG 1g.10gb")


def _problems(tmp_path: Path, body: str) -> list[str]:
    f = tmp_path / "c.yaml"
    f.write_text(body)
    with pytest.raises(LocatedError) as e:
        load_config(f)
    return [str(p) for p in e.value.problems]


def test_a_bad_entry_is_reported_with_its_file_line_and_what_to_do(tmp_path: Path) -> None:
    body = ("agent:\n  thresholds:\n    idle_by_model:\n"
            "      - {model: '*H100*', signal: sm_active, below: 3}\n"
            "      - {model: '*A100*', signal: memory, below: 5}\n"
            "      - {model: '*L4*', signal: utilization, below: 150}\n"
            "      - {model: '*L40S*', signal: power, below: 90, power_below_w: 100}\n"
            "      - {signal: power, below: 90}\n")
    problems = _problems(tmp_path, body)
    f = tmp_path / "c.yaml"
    key = "agent.thresholds.idle_by_model"
    assert problems == [
        f"{f}:5: {key}.signal: Input should be 'utilization', 'sm_active' or 'power'",
        f"{f}:6: {key}: below: utilization is a percentage (0 to 100), got 150; for watts use signal: power",
        f"{f}:7: {key}: power_below_w: power is already the signal here; drop power_below_w, or choose "
        "signal: utilization or sm_active with power as the second signal",
        f"{f}:8: {key}.model: is required",
    ]
