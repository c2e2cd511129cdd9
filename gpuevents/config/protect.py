"""Config `protect`: what destructive actions never touch; programs matched by their executable, not their name."""

from __future__ import annotations

import fnmatch

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProtectedProgram(_Section):
    """A program never killed: its executable's path (fnmatch), and optionally the user it must run as."""

    exe: str = Field(min_length=1, description="fnmatch on the executable's path, e.g. /usr/bin/nvidia-smi")
    user: str | None = Field(None, description="protected only when run by this user")

    @field_validator("exe")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith(("/", "*")):
            raise ValueError(f"exe must be a path (pattern) such as /usr/bin/nvidia-smi, got {v!r}")
        return v


class ProtectConfig(_Section):
    users: list[str] = Field(default_factory=lambda: ["root"])
    node_labels: dict[str, str] = Field(default_factory=dict)
    process_patterns: list[str] = Field(default_factory=list, description="fnmatch on the executable's file name "
                                        "(or its path, for a pattern with '/'), never the name a process sets")
    processes: list[ProtectedProgram] = Field(default_factory=list, description="programs by path and user")
    namespaces: list[str] = Field(default_factory=lambda: ["kube-system"])
    workload_labels: dict[str, str] = Field(default_factory=dict, description="Kubernetes workloads carrying "
                                            "one of these labels are never paused, drained or cancelled")
    partitions: list[str] = Field(default_factory=list, description="Slurm partitions never cancelled in")
    accounts: list[str] = Field(default_factory=list, description="Slurm accounts whose jobs are never cancelled")
    qos: list[str] = Field(default_factory=list, description="Slurm QOS whose jobs are never cancelled")

    def program_reason(self, pid: int | None, exe: str, user: str | None) -> str | None:
        """Why the process running `exe` (`/proc/<pid>/exe`) as `user` is protected, or None. The name a
        process gives itself (`/proc/<pid>/comm`, prctl PR_SET_NAME) is never read: any user can set it.
        An unknown executable, with programs protected, is refused: cannot tell."""
        if not (self.process_patterns or self.processes):
            return None
        if not exe:
            return f"the program of pid {pid} is unknown: cannot tell whether it is protected"
        base = exe.rsplit("/", 1)[-1]
        for pattern in self.process_patterns:
            if fnmatch.fnmatchcase(exe if "/" in pattern else base, pattern):
                return f"program {exe} matches protected pattern {pattern!r}"
        for prog in self.processes:
            if fnmatch.fnmatchcase(exe, prog.exe) and (prog.user is None or prog.user == user):
                return f"program {exe}" + (f" run by {user}" if prog.user else "") + " is protected"
        return None
