"""The quick loop: end-to-end tests are marked `slow` (by fixture in tests/conftest.py, or by their module), and
`-m "not slow"` runs hypothesis with fewer examples."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

from tests.quick import MARKS_OUT, QUICK_EXAMPLES, examples, is_quick

# One module per way a test is marked: a fixture (slurm_env needs slurm; nats_cluster), a module's pytestmark,
# one test's own mark; test_lazy.py is all quick.
FILES = ["tests/actions/test_slurm.py", "tests/rules/engine/partitions/test_replica.py",
         "tests/gpuevents/cli/test_serve.py", "tests/rules/dashboard/test_dashboard.py",
         "tests/gpuevents/cli/test_lazy.py"]


def collected() -> tuple[list[str], list[str]]:
    """The tests of FILES that `-m slow` and `-m "not slow"` select: one collection, marks as conftest leaves them."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "marks"
        run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              "-p", "tests.quick", *FILES], capture_output=True, text=True, timeout=120,
                             env={**os.environ, MARKS_OUT: str(out)})
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        lines = [line.split(" ", 1) for line in out.read_text().splitlines()]
    assert lines and all("::" in test for _, test in lines)
    return [t for m, t in lines if m == "slow"], [t for m, t in lines if m == "quick"]


def test_slow_holds_the_clusters_the_processes_and_the_browser_and_not_slow_the_rest() -> None:
    slow, quick = collected()
    assert not set(slow) & set(quick)
    for f in (FILES[0], FILES[2]):  # every test of these uses Slurm or runs `gpuevents up`
        assert any(t.startswith(f) for t in slow), f
        assert not any(t.startswith(f) for t in quick), f
    three_servers = ("tests/rules/engine/partitions/test_replica.py::"
                     "test_publishing_and_consuming_go_on_when_a_nats_server_dies")
    assert three_servers in slow and three_servers not in quick
    chromium = "tests/rules/dashboard/test_dashboard.py::test_dashboard_in_chromium"
    assert any(t.startswith(chromium) for t in slow)
    assert any(t.startswith("tests/rules/dashboard/test_dashboard.py::") for t in quick)
    assert any(t.startswith("tests/gpuevents/cli/test_lazy.py::") for t in quick)
    assert not any(t.startswith("tests/gpuevents/cli/test_lazy.py::") for t in slow)


def test_the_quick_loop_runs_fewer_hypothesis_examples(request: pytest.FixtureRequest) -> None:
    quick = os.environ.get("GPUEVENTS_QUICK") == "1" or "not slow" in (request.config.option.markexpr or "")
    assert is_quick() == quick
    assert examples(400) == (QUICK_EXAMPLES if quick else 400)
    if quick:
        assert settings.default is not None and settings.default.max_examples == QUICK_EXAMPLES
    assert settings.default is not None and settings.default.deadline is None  # no test fails on timing, in either loop
