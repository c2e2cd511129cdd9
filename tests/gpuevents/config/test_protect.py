"""`protect`: programs are matched by their executable (never the name a process sets), by file name or path
pattern, optionally only for one user; an unknown executable is refused when programs are protected."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuevents.config.protect import ProtectConfig, ProtectedProgram


def test_nothing_is_protected_by_program_when_none_are_listed() -> None:
    assert ProtectConfig().program_reason(42, "", None) is None
    assert ProtectConfig().users == ["root"] and ProtectConfig().namespaces == ["kube-system"]


def test_a_pattern_without_a_slash_matches_the_file_name_and_with_one_the_path() -> None:
    cfg = ProtectConfig(process_patterns=["nvidia-*", "/opt/dcgm/*"])
    assert cfg.program_reason(1, "/usr/bin/nvidia-smi", "bob") == \
        "program /usr/bin/nvidia-smi matches protected pattern 'nvidia-*'"
    assert cfg.program_reason(1, "/opt/dcgm/hostengine", "bob") is not None
    assert cfg.program_reason(1, "/home/bob/nvidia-smi.py/python", "bob") is None
    assert cfg.program_reason(1, "/usr/bin/python3", "bob") is None


def test_a_program_listed_for_a_user_is_protected_only_when_that_user_runs_it() -> None:
    cfg = ProtectConfig(processes=[ProtectedProgram(exe="/usr/bin/dcgm*", user="dcgm"),
                                   ProtectedProgram(exe="/usr/sbin/slurmd")])
    assert cfg.program_reason(7, "/usr/bin/dcgmi", "dcgm") == "program /usr/bin/dcgmi run by dcgm is protected"
    assert cfg.program_reason(7, "/usr/bin/dcgmi", "mallory") is None
    assert cfg.program_reason(7, "/usr/sbin/slurmd", "anyone") == "program /usr/sbin/slurmd is protected"


def test_an_unknown_executable_cannot_be_told_apart_so_it_is_refused() -> None:
    reason = ProtectConfig(process_patterns=["nvidia-*"]).program_reason(99, "", "bob")
    assert reason == "the program of pid 99 is unknown: cannot tell whether it is protected"


def test_a_program_must_be_given_by_its_path() -> None:
    with pytest.raises(ValidationError, match="exe must be a path"):
        ProtectedProgram(exe="nvidia-smi")
    assert ProtectedProgram(exe="*/nvidia-smi").exe == "*/nvidia-smi"
