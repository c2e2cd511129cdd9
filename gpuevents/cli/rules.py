"""`gpuevents rules check` and `gpuevents rules test`: a typer app the main command line mounts as `rules`."""

from __future__ import annotations

from pathlib import Path

import typer

from rules.offline.check import check_paths
from rules.offline.ruletests import run_test_file

app = typer.Typer(help="Validate and test rule files.", no_args_is_help=True, add_completion=False)


@app.command("check")
def check(
    paths: list[Path] = typer.Argument(..., help="rule files or directories"),  # noqa: B008
    timezone: str = typer.Option("UTC", help="default timezone for rules without one (engine.timezone)"),
) -> None:
    """Validate rule files: every problem as `file:line: message`; exit 1 on any."""
    rules, problems = check_paths(paths, default_timezone=timezone)
    for p in problems:
        typer.echo(str(p))
    if problems:
        typer.echo(f"{len(problems)} problem(s)", err=True)
        raise typer.Exit(1)
    assert rules is not None
    typer.echo(f"ok: {len(rules)} rule(s) in {len(rules.files)} file(s)")


def test_files(paths: list[Path]) -> list[Path]:
    """Files as given; a directory contributes its *.test.yaml files, recursively."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out.extend(sorted(p.rglob("*.test.yaml")) + sorted(p.rglob("*.test.yml")))
        else:
            out.append(p)
    return out


@app.command("test")
def test(
    files: list[Path] = typer.Argument(..., help="rule test files (or directories of *.test.yaml)"),  # noqa: B008
) -> None:
    """Run rule tests on a virtual clock. Exit 0 all pass, 1 a test failed, 2 a file is invalid."""
    invalid = failed = passed = 0
    for f in test_files(files):
        outcome = run_test_file(f)
        if outcome.invalid:
            invalid += 1
            typer.echo(f"INVALID {f}")
            for p in outcome.problems:
                typer.echo(f"  {p}")
            continue
        typer.echo(f"{f}")
        for t in outcome.tests:
            if t.passed:
                passed += 1
                typer.echo(f"  PASS {t.name}")
            else:
                failed += 1
                typer.echo(f"  FAIL {t.name}")
                for failure in t.failures:
                    for line in failure.splitlines():
                        typer.echo(f"    {line}")
    typer.echo(f"{passed} passed, {failed} failed" + (f", {invalid} invalid file(s)" if invalid else ""))
    if invalid:
        raise typer.Exit(2)
    if failed:
        raise typer.Exit(1)
