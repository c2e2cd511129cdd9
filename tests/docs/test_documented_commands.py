"""Every `gpuevents` command and option that README.md and docs/*.md show exists: each documented command line is
resolved against the real command tree and its `--help` runs; a missing one fails naming file:line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer import _click
from typer.testing import CliRunner

from gpuevents.cli import app
from tests.docs.snippets import Command, Where, commands, doc_files, option_names


def _root() -> Any:
    return typer.main.get_command(app)


def resolve(command: Command) -> tuple[list[str], str | None]:
    """The subcommand path a documented line names, and what is wrong with it (None: it exists)."""
    current = _root()
    ctx = _click.Context(current, info_name="gpuevents")
    path: list[str] = []
    words = list(command.words)
    if command.after is not None:  # a word listed after a command: its sibling, or more of its options
        before, problem = resolve(command.after)
        if problem is not None:
            return before, None  # reported at the command it follows
        words = [*(before if words[0].startswith("-") else before[:-1]), *words]
    while hasattr(current, "list_commands"):
        if not words or words[0].startswith("-"):
            return path, None if words and words[0] == "--help" else (
                f"`gpuevents {' '.join(path)}` needs a subcommand: one of {', '.join(current.list_commands(ctx))}")
        word = words.pop(0)
        sub = current.get_command(ctx, word) if word in current.list_commands(ctx) else None
        if sub is None:
            where = f"gpuevents {' '.join(path)}".strip()
            return path, f"`{where}` has no command {word!r}; it has: {', '.join(current.list_commands(ctx))}"
        path.append(word)
        ctx = _click.Context(sub, parent=ctx, info_name=word)
        current = sub
    known = {"--help"} | {o for p in current.params for o in (*p.opts, *p.secondary_opts)}
    unknown = [o for w in words for o in option_names(w) if o not in known]
    if unknown:
        return path, f"`gpuevents {' '.join(path)}` has no option {', '.join(unknown)}"
    return path, None


def documented(root: Path | None = None) -> list[Command]:
    return [c for f in doc_files(*(() if root is None else (root,))) for c in commands(f, *(() if root is None
                                                                                             else (root,)))]


def test_the_docs_show_commands() -> None:
    found = documented()
    # the README's own table alone names a couple of dozen; a broken extractor would find few or none
    assert len(found) > 100, len(found)
    assert any(c.words[:2] == ("rules", "check") for c in found)
    assert any(c.words[:1] == ("up",) for c in found)


def test_every_documented_command_and_option_exists() -> None:
    problems = [f"{c.where}: {c.text}: {why}" for c in documented() if (why := resolve(c)[1]) is not None]
    assert not problems, "\n".join(problems)


def test_the_help_of_every_documented_command_runs() -> None:
    paths = sorted({tuple(resolve(c)[0]) for c in documented() if resolve(c)[1] is None})
    runner = CliRunner()
    failed = []
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        if result.exit_code != 0 or "Usage" not in result.output:
            failed.append(f"gpuevents {' '.join(path)} --help: exit {result.exit_code}: {result.output[-300:]}")
    assert len(paths) > 15
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize(("line", "expected"), [
    ("`gpuevents history --since 7d`", "has no command 'history'"),
    ("`gpuevents up`, `simulate`, `history`", "has no command 'history'"),
    ("`gpuevents rules check` / `lint`", "`gpuevents rules` has no command 'lint'"),
    ("`gpuevents report --week` or `--weekly`", "has no option --weekly"),
    ("`gpuevents rules lint x.yaml`", "has no command 'lint'"),
    ("`gpuevents status --nodes`", "has no option --nodes"),
    ("`gpuevents rules`", "needs a subcommand"),
])
def test_a_command_the_code_lacks_is_named_with_its_line(tmp_path: Path, line: str, expected: str) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n\nRun `gpuevents up --demo`.\n")
    (tmp_path / "docs" / "page.md").write_text(f"# page\n\ntext\n{line} does it.\n")
    found = [(c, resolve(c)[1]) for c in documented(tmp_path)]
    assert found[0][0].where == Where("README.md", 3) and found[0][1] is None
    assert all(c.where == Where("docs/page.md", 4) for c, _ in found[1:])
    problems = [why for _, why in found if why is not None]
    assert len(problems) == 1 and expected in problems[0], problems


def test_words_listed_after_a_command_are_its_siblings_or_options(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(
        "`gpuevents rules check`, `test` and `backtest`; `gpuevents report --week` / `--weeks 13`, "
        "`gpuevents status` then `engine.dry_run` and `GPUEVENTS_X`.\n")
    found = documented(tmp_path)
    assert [(c.text, resolve(c)) for c in found] == [
        ("gpuevents rules check", (["rules", "check"], None)), ("test", (["rules", "test"], None)),
        ("backtest", (["rules", "backtest"], None)), ("gpuevents report --week", (["report"], None)),
        ("--weeks 13", (["report"], None)), ("gpuevents status", (["status"], None))]


def test_commands_in_shell_blocks_are_found_where_a_shell_runs_them(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "docs" / "page.md").write_text(
        "```sh\n"
        "helm upgrade --install gpuevents deploy/helm/gpuevents\n"
        "kubectl exec deploy/x -- gpuevents status --all | head\n"
        "GPUEVENTS_ENGINE__DRY_RUN=true .venv/bin/gpuevents engine \\\n"
        "  -c config.yaml  # comment\n"
        "```\n"
        "```yaml\ncommand: gpuevents nothing\n```\n")
    found = documented(tmp_path)
    assert [(str(c.where), c.words) for c in found] == [
        ("docs/page.md:3", ("status", "--all")), ("docs/page.md:4", ("engine", "-c", "config.yaml"))]
