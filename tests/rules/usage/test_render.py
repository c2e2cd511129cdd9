"""Markdown reports: any name from a machine is one inert table cell, read back by a real parser."""

from __future__ import annotations

from datetime import timedelta

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

from gpuevents.config import CostsConfig
from gpuevents.costs import CostModel
from rules.usage.render import markdown_cell, render_markdown
from rules.usage.store import IdleJobRow, UsageRow
from rules.usage.weekly import build_report, week_ending
from tests.rules.dashboard.fleetday import DAY_START

# CommonMark with GFM tables and strikethrough; raw HTML on, as on GitHub (which then sanitises).
PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
PLAIN = {"text", "text_special"}  # text_special: an escaped character or an entity, shown as itself

HOSTILE = [
    "evil | injected | cells",
    "line one\nline two",
    "a\r\nb\rc\u2028d\u2029e\x0bf\x0cg\x85h",
    "tab\there nul\x00 bell\x07",
    "[click me](https://evil.example/)",
    "![pixel](https://evil.example/p.png)",
    "<https://evil.example/>",
    "<img src=x onerror=alert(1)>",
    "<script>alert(1)</script>",
    "**bold** __bold__ *it* _it_ ~~struck~~ ~one~",
    "`code` ``more``",
    "&lt;b&gt; &amp; &#60; &copy;",
    "ends with a backslash \\",
    "\\| escaped pipe \\\\| and \\\\\\|",
    "[ref]: https://evil.example/",
    "$x^2$ and $$y$$",
    "#1 + - > quote",
    "",
    "   ",
]


def _cells(markdown: str) -> list[list[Token]]:
    """The inline token of every table cell, row by row (header rows included)."""
    rows: list[list[Token]] = []
    in_cell = False
    for token in PARSER.parse(markdown):
        if token.type == "tr_open":
            rows.append([])
        elif token.type in ("td_open", "th_open"):
            in_cell = True
        elif token.type in ("td_close", "th_close"):
            in_cell = False
        elif token.type == "inline" and in_cell:
            rows[-1].append(token)
    return rows


def _text(cell: Token) -> str:
    return "".join(child.content for child in cell.children or [])


def _kinds(cell: Token) -> set[str]:
    return {child.type for child in cell.children or []}


def _as_shown(name: str) -> str:
    """What a reader should see: the name on one line, as the parser trims a cell."""
    return "".join(" " if c in "\r\n\u2028\u2029\x0b\x0c\x85\t\x00\x07" else c for c in name).strip()


@pytest.mark.parametrize("name", HOSTILE)
def test_any_name_is_one_cell_shown_as_written(name: str) -> None:
    table = f"| name | next |\n| --- | --- |\n| {markdown_cell(name)} | after |\n"
    assert "\n" not in markdown_cell(name)
    rows = _cells(table)
    assert len(rows) == 2, table
    body = rows[1]
    assert [_text(c) for c in body] == [_as_shown(name), "after"], table
    assert _kinds(body[0]) <= PLAIN, table  # no link, image, HTML, code, emphasis, line break


@pytest.mark.parametrize("name", ["see https://evil.example/x", "ftp://evil.example", "WWW.evil.example",
                                  "go to www.evil.example now"])
def test_web_addresses_are_not_autolinked(name: str) -> None:
    # cmark-gfm's autolink extension (not in the parser above) starts a link where it reads an
    # unescaped `:` after a scheme, or `www.`; an escaped character never triggers it
    cell = markdown_cell(name)
    assert ":" not in cell.replace("\\:", "") and "www." not in cell.lower()
    assert _text(_cells(f"| a |\n| --- |\n| {cell} |\n")[1][0]) == name


def test_an_email_owner_is_left_readable() -> None:
    assert markdown_cell("carol@example.com") == "carol@example.com"
    assert markdown_cell("python (pid 100)") == "python (pid 100)"


def test_a_report_with_hostile_names_keeps_its_table_shape() -> None:
    since, until = week_ending(DAY_START + timedelta(days=1))
    hour = int(since.timestamp())
    node, owner, team = "n1 | x\n| y", "[me](https://evil.example/)", "ops\n# heading <b>"
    job = "ns/pod`<img src=x>`|![i](https://evil.example/i.png)"
    usage = [UsageRow(hour, "c", node, 0, owner, team, "H100", busy_s=0, held_s=3600, free_s=0, util_s=0,
                      util_known_s=3600, busy_kwh=0, held_kwh=0.1, free_kwh=0)]
    jobs = [IdleJobRow(hour, "c", node, 0, "pod:x", job, owner, team, "H100", held_s=3600, held_kwh=0.1)]
    costs = CostModel(CostsConfig())
    for selected in (None, team):
        md = render_markdown(build_report(usage, jobs, costs, since=since, until=until,
                                          generated_at=until, team=selected), costs)
        rows = _cells(md)
        # teams: head, team, owner; energy: head, team; leaderboard: head, owner; jobs: head, job
        assert [len(r) for r in rows] == [7, 7, 7, 3, 3, 8, 8, 8, 8], md
        team_row, owner_row, energy_row, leader_row, job_row = rows[1], rows[2], rows[4], rows[6], rows[8]
        assert _text(energy_row[0]) == _as_shown(team)
        assert _text(team_row[0]) == _as_shown(team)
        assert _text(owner_row[0]) == owner
        assert [_text(c) for c in leader_row[:3]] == ["1", owner, _as_shown(team)]
        assert [_text(c) for c in job_row[:6]] == [job, "", _as_shown(node), "0", owner, _as_shown(team)]
        for row in rows:
            for cell in row:
                assert _kinds(cell) <= PLAIN | {"strong_open", "strong_close"}, md  # bold: the team rows
        heading = [t for t in PARSER.parse(md) if t.type == "heading_open"]
        assert len(heading) == 5, md  # the title and the four section headings, no injected one
