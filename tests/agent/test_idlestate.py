"""The idle clocks kept on disk: saved atomically, carried over only when recent, never from the future; an
unreadable or missing file is no clocks; a node's name cannot steer the path; a disk that refuses is said once."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.idlestate import IdleStateFile

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


def test_saved_clocks_come_back_when_recent(tmp_path: Path) -> None:
    f = IdleStateFile(tmp_path, "n1")
    marks = {"GPU-a": T0 - 2 * HOUR, "GPU-b": T0 - timedelta(minutes=5)}
    f.save(T0, marks)
    assert f.path == tmp_path / "idle-n1.json" and not f.path.with_suffix(".tmp").exists()
    assert IdleStateFile(tmp_path, "n1").load(T0 + timedelta(minutes=3), max_age=HOUR) == marks


def test_clocks_too_old_or_saved_in_the_future_are_not_carried_over(tmp_path: Path) -> None:
    f = IdleStateFile(tmp_path, "n1")
    f.save(T0, {"GPU-a": T0 - HOUR})
    assert f.load(T0 + 2 * HOUR, max_age=HOUR) == {}
    assert f.load(T0 - timedelta(seconds=1), max_age=HOUR) == {}


def test_a_mark_later_than_now_is_dropped(tmp_path: Path) -> None:
    f = IdleStateFile(tmp_path, "n1")
    f.save(T0, {"GPU-a": T0 - HOUR, "GPU-b": T0 + HOUR})
    assert f.load(T0, max_age=HOUR) == {"GPU-a": T0 - HOUR}


@pytest.mark.parametrize("content", ["{half", '{"saved_at": "yesterday", "idle_since": {}}', '{"idle_since": {}}',
                                     '{"saved_at": "2026-01-05T09:00:00+00:00", "idle_since": ["GPU-a"]}'])
def test_an_unreadable_file_is_no_clocks_and_a_warning(tmp_path: Path, content: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    f = IdleStateFile(tmp_path, "n1")
    f.path.write_text(content)
    assert f.load(T0, max_age=HOUR) == {}
    assert "ignoring the saved idle clocks" in caplog.text


def test_a_missing_file_is_no_clocks_quietly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert IdleStateFile(tmp_path / "none", "n1").load(T0, max_age=HOUR) == {}
    assert caplog.text == ""


def test_a_node_name_cannot_leave_the_directory(tmp_path: Path) -> None:
    f = IdleStateFile(tmp_path, "../../etc/passwd")
    assert f.path.parent == tmp_path and f.path.name == "idle-.._.._etc_passwd.json"


def test_a_directory_that_cannot_be_written_is_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "file").write_text("")
    f = IdleStateFile(tmp_path / "file", "n1")  # a file where the directory should be
    caplog.set_level(logging.WARNING)
    f.save(T0, {"GPU-a": T0})
    f.save(T0, {"GPU-a": T0})
    assert caplog.text.count("cannot keep the idle clocks") == 1
