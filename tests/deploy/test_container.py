"""The Dockerfile, its build context (.dockerignore) and the image's entrypoint script."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.conftest import DEPLOY, REPO

ENTRYPOINT = DEPLOY / "container" / "entrypoint.sh"
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", ".gpuevents", "test-artifacts"}


@dataclass(frozen=True)
class Instruction:
    op: str
    args: str
    stage: int


def instructions() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    out: list[Instruction] = []
    stage = -1
    buf = ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        full = (buf + line).strip()
        buf = ""
        op, _, args = full.partition(" ")
        if op.upper() == "FROM":
            stage += 1
        out.append(Instruction(op.upper(), args.strip(), stage))
    return out


def final_stage() -> list[Instruction]:
    ins = instructions()
    last = max(i.stage for i in ins)
    return [i for i in ins if i.stage == last]


def _pattern(p: str) -> re.Pattern[str]:
    p = p.strip().strip("/")
    out = ""
    i = 0
    while i < len(p):
        if p.startswith("**/", i):
            out += "(?:[^/]+/)*"
            i += 3
        elif p.startswith("**", i):
            out += ".*"
            i += 2
        elif p[i] == "*":
            out += "[^/]*"
            i += 1
        elif p[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(p[i])
            i += 1
    return re.compile(out)


def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    rules = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keep = line.startswith("!")
            rules.append((keep, _pattern(line.removeprefix("!"))))
    return rules


def in_context(rel: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parents decides."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    included = True
    for keep, pattern in rules:
        if any(pattern.fullmatch(c) for c in candidates):
            included = keep
    return included


def build_context() -> set[str]:
    rules = dockerignore()
    files: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            rel = os.path.relpath(os.path.join(dirpath, f), REPO).replace(os.sep, "/")
            if in_context(rel, rules):
                files.add(rel)
    return files


def package_dirs() -> list[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.rstrip("*") for p in patterns})


# ------------------------------------------------------------------ Dockerfile
def test_every_stage_starts_from_a_slim_python() -> None:
    froms = [i.args for i in instructions() if i.op == "FROM"]
    assert len(froms) == 2
    for f in froms:
        assert re.fullmatch(r"python:\$\{PYTHON_VERSION\}-slim( AS \w+)?", f), f
    version = next(i.args for i in instructions() if i.op == "ARG" and i.args.startswith("PYTHON_VERSION"))
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    assert tuple(map(int, version.split("=")[1].split("."))) >= tuple(map(int, requires.removeprefix(">=").split(".")))


def test_the_image_installs_the_package_with_pip() -> None:
    runs = " ".join(i.args for i in instructions() if i.op == "RUN")
    assert "pip install ." in runs
    assert "gpuevents --help" in runs, "the build checks the installed command starts"


def test_the_image_runs_as_a_non_root_user_by_default() -> None:
    final = final_stage()
    users = [i.args for i in final if i.op == "USER"]
    assert users, "the final stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, "numeric, so runAsNonRoot can check it"
    ops = [i.op for i in final]
    assert ops.index("USER") > max(n for n, op in enumerate(ops) if op == "RUN"), "USER after the RUNs"


def test_entrypoint_and_default_command_are_exec_form() -> None:
    final = final_stage()
    (entrypoint,) = [i.args for i in final if i.op == "ENTRYPOINT"]
    (cmd,) = [i.args for i in final if i.op == "CMD"]
    assert entrypoint == '["gpuevents-entrypoint"]'
    assert cmd == '["engine", "-c", "/etc/gpuevents/config.yaml"]'
    copied = [i.args for i in final if i.op == "COPY" and "entrypoint.sh" in i.args]
    assert copied == ["deploy/container/entrypoint.sh /usr/local/bin/gpuevents-entrypoint"]


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    context = build_context()
    for ins in instructions():
        if ins.op != "COPY" or "--from=" in ins.args:
            continue
        *sources, _dest = shlex.split(ins.args)
        for src in sources:
            path = REPO / src
            assert path.exists(), f"COPY {src}: no such file"
            files = [src] if path.is_file() else [
                os.path.relpath(os.path.join(d, f), REPO) for d, _, fs in os.walk(path)
                for f in fs if "__pycache__" not in d]
            missing = [f for f in files if f not in context]
            assert not missing, f"COPY {src}: excluded by .dockerignore: {missing[:5]}"


def test_the_build_copies_every_package_and_what_pyproject_reads() -> None:
    copied = {s for i in instructions() if i.op == "COPY" and "--from=" not in i.args
              for s in shlex.split(i.args)[:-1]}
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert {"pyproject.toml", pyproject["project"]["readme"], *package_dirs()} <= copied


def test_the_build_context_leaves_out_tests_docs_and_local_state() -> None:
    context = build_context()
    for outside in ("tests/", "docs/", "deploy/kubernetes/", "deploy/nats/", "benchmarks/"):
        assert not any(f.startswith(outside) for f in context), outside
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in context)


@pytest.mark.slow
def test_the_build_context_makes_a_package_with_every_module(tmp_path: Path) -> None:
    """What `pip install .` sees in the image: an sdist built from exactly the context's files."""
    ctx = tmp_path / "ctx"
    for rel in build_context():
        (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, ctx / rel)
    result = subprocess.run(
        [sys.executable, "-c", "from setuptools import build_meta; print(build_meta.build_sdist('dist'))"],
        cwd=ctx, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    sdist = ctx / "dist" / result.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    modules = {os.path.relpath(p, REPO) for d in package_dirs() for p in (REPO / d).rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules, "no modules found"
    assert not modules - names, f"left out of the package: {sorted(modules - names)[:10]}"


# ------------------------------------------------------------------ entrypoint
@pytest.fixture
def fake_gpuevents(tmp_path: Path) -> dict[str, str]:
    """An environment whose `gpuevents` prints its arguments and NATS variables."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gpuevents"
    fake.write_text('#!/bin/sh\necho "args=$*"\necho "password=${NATS_PASSWORD:-}"\n'
                    'echo "file=${NATS_PASSWORD_FILE:-unset}"\n')
    fake.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def run_entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", str(ENTRYPOINT), *args], env=env, capture_output=True,
                          text=True, timeout=30)


def test_entrypoint_reads_the_nats_password_from_its_file(fake_gpuevents: dict[str, str],
                                                          tmp_path: Path) -> None:
    secret = tmp_path / "gpu-01"
    secret.write_text("s3cret-pw\n")
    result = run_entrypoint({**fake_gpuevents, "NATS_PASSWORD_FILE": str(secret)},
                            "agent", "-c", "/etc/gpuevents/config.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["args=agent -c /etc/gpuevents/config.yaml",
                                          "password=s3cret-pw", "file=unset"]


def test_entrypoint_without_a_password_file_runs_gpuevents_as_is(fake_gpuevents: dict[str, str]) -> None:
    result = run_entrypoint({**fake_gpuevents, "NATS_PASSWORD": "from-env"}, "engine")
    assert result.returncode == 0
    assert result.stdout.splitlines() == ["args=engine", "password=from-env", "file=unset"]


def test_entrypoint_says_which_node_has_no_password(fake_gpuevents: dict[str, str], tmp_path: Path) -> None:
    missing = tmp_path / "nats-agent" / "gpu-99"
    result = run_entrypoint({**fake_gpuevents, "NATS_PASSWORD_FILE": str(missing)}, "agent")
    assert result.returncode == 78
    assert str(missing) in result.stderr and "nats_auth.py" in result.stderr
    assert result.stdout == ""
