"""The keeps section: a reason is what its owner typed, so it stays inert text in HTML, one Markdown cell and
Slack's mrkdwn."""

from __future__ import annotations

from datetime import UTC, datetime

from actions import slack_format
from rules.usage.keeps import KeepReason, TeamKeeps
from rules.usage.render import markdown_cell
from rules.usage.render_keeps import keeps_html, keeps_markdown, keeps_summary
from tests.rules.usage.test_render import _cells

EVIL = "<script>x</script> | *bold* [link](http://x) <!channel>"


def _keeps() -> list[TeamKeeps]:
    reason = KeepReason(entity_id="n1/gpu0", rule="idle", by="slack:U1", reason=EVIL,
                        until=datetime(2026, 1, 9, tzinfo=UTC), gpu_hours=2.0, idle_share_pct=50.0,
                        approved_by="U2 in #leads")
    return [TeamKeeps(team="", count=1, kept_gpu_hours=2.0, idle_share_pct=50.0, reasons=[reason])]


def test_a_reason_is_shown_as_written_never_as_markup() -> None:
    html = keeps_html(_keeps())
    assert "<script>" not in html and "&lt;script&gt;x&lt;/script&gt;" in html
    assert "approved by U2 in #leads" in html and "(no team)" in html
    rows = _cells("\n".join(keeps_markdown(_keeps(), markdown_cell)))
    assert len(rows) == 2 and all(len(r) == 5 for r in rows)  # the reason's `|` split nothing
    assert [t.type for t in rows[1][4].children or []] and all(
        t.type in ("text", "text_special") for t in rows[1][4].children or [])  # no link, no emphasis
    [line] = keeps_summary(_keeps(), slack_format.escape)
    assert "<!channel>" not in line and "&lt;!channel&gt;" in line
    assert line.startswith("Keeps, (no team): 1 (2.0 GPU-h kept, 50% of it idle); why: ")


def test_no_keeps_no_section() -> None:
    assert keeps_html([]) == "" and keeps_markdown([], markdown_cell) == [] and keeps_summary([], str) == []
