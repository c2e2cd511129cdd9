"""The usage reports' template environment: templates written one element a line come out on one line, and
every template ships in a non-editable install (pyproject's package data names it)."""

from __future__ import annotations

import tomllib
from datetime import UTC, datetime
from fnmatch import fnmatch
from importlib.resources import files
from pathlib import Path

from rules.usage.html import render_template
from rules.usage.keeps import KeepReason, TeamKeeps
from rules.usage.render_keeps import keep_count

ROOT = Path(__file__).resolve().parents[3]


def test_a_template_written_over_many_lines_renders_as_one() -> None:
    reason = KeepReason(entity_id="n1/gpu0", rule="idle", by="slack:U1", reason="eval run",
                        until=datetime(2026, 1, 9, tzinfo=UTC), gpu_hours=2.0, idle_share_pct=50.0)
    keeps = [TeamKeeps(team="nlp", count=1, kept_gpu_hours=2.0, idle_share_pct=50.0, reasons=[reason])] * 2
    html = render_template("keeps.html.j2", keeps=keeps, pct=lambda v: f"{v:.0f}%", count=keep_count,
                           team_label=str)
    assert "\n" not in html and "  " not in html
    assert html.count('<tr><td class="t">nlp</td><td>1</td><td>2.0</td><td>50%</td>') == 2
    assert "n1/gpu0 (slack:U1, 2.0 GPU-h, idle 50%): eval run</td>" in html


def test_every_template_is_package_data() -> None:
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["*"]
    templates = [f"templates/{t.name}" for t in files("rules.usage").joinpath("templates").iterdir()]
    assert len(templates) >= 6
    assert all(any(fnmatch(t, p) for p in patterns) for t in templates), (templates, patterns)
