"""The engine's rule files: loaded as `rules check` loads them, changes seen after a good or a failed load."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuevents.config import Config
from gpuevents.yamlpos import LocatedError
from rules.engine.rulefiles import RuleFiles
from tests.rules.engine.conftest import IDLE_RULES


def test_a_load_gives_the_rules_and_nothing_has_changed_since(rules_dir: Path) -> None:
    files = RuleFiles([rules_dir], Config())
    assert list(files.load().by_name) == ["idle-gpu-1h"]
    assert not files.changed()


def test_a_new_file_and_a_modified_file_are_changes(rules_dir: Path) -> None:
    files = RuleFiles([rules_dir], Config())
    files.load()
    (rules_dir / "more.yaml").write_text("rules: []\n")
    assert files.changed()
    files.load()
    st = (rules_dir / "idle.yaml").stat()
    os.utime(rules_dir / "idle.yaml", (st.st_atime, st.st_mtime + 10))
    assert files.changed()


def test_a_failed_load_is_remembered_so_the_same_broken_file_is_not_loaded_again(rules_dir: Path) -> None:
    files = RuleFiles([rules_dir], Config())
    files.load()
    (rules_dir / "idle.yaml").write_text(IDLE_RULES + "  - name: Bad Name\n    entity: gpu\n")
    with pytest.raises(LocatedError, match=r"idle\.yaml"):
        files.load()
    assert not files.changed()
