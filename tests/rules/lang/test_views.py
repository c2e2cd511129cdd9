"""The fields rules see on a GPU: every field of the event contract is a field of the view."""

from __future__ import annotations

from pathlib import Path

from gpuevents.events import GpuInfo
from rules.intake.check import check_paths
from rules.lang.views import GPU_FIELDS, EvalClock, GpuView

SPINNING = """\
rules:
  - name: spinning-gpu
    entity: gpu
    when: gpu.util_pct is not none and gpu.util_pct > 90 and gpu.sm_active_pct is not none and gpu.sm_active_pct < 5
    for: 1h
    actions:
      - {type: log, message: "GPU {{ gpu.index }}: {{ gpu.sm_active_pct }}% SMs, {{ gpu.tensor_active_pct }}% tensor"}
"""


def test_gpm_activity_is_a_gpu_field_rules_can_name() -> None:
    assert {"sm_active_pct", "tensor_active_pct"} <= GPU_FIELDS
    view = GpuView(EvalClock(), id="n1/gpu0", node="n1", index=0, sm_active_pct=1.5, tensor_active_pct=0.0)
    assert (view.sm_active_pct, view.tensor_active_pct, view.util_pct) == (1.5, 0.0, None)


def test_every_gpu_field_of_the_contract_is_in_the_view() -> None:
    assert set(GpuInfo.model_fields) <= GPU_FIELDS


def test_rules_check_accepts_conditions_and_templates_on_gpm_activity(tmp_path: Path) -> None:
    (tmp_path / "spin.yaml").write_text(SPINNING)
    rules, problems = check_paths([tmp_path])
    assert problems == [] and rules is not None and len(rules) == 1
