"""The usage reports' HTML escapes a hostile team, owner or job name exactly once, in every section it reaches:
the pages are Jinja2 templates rendered with autoescape on, and nothing escapes a name a second time."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from gpuevents.costs import CostModel
from rules.usage import render_quarter
from rules.usage.keeps import KeepReason, TeamKeeps
from rules.usage.render import render_html
from rules.usage.weekly import ExemptionLine, RightsizeLine, WeeklyReport
from tests.rules.dashboard import quarterweeks as qw
from tests.rules.usage.test_weekly import COSTS, _fill, _report

EVIL = """<script>alert("x")</script> & 'q'"""
ONCE = "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#39;q&#39;"
TWICE = re.compile(r"&amp;(lt|gt|amp|#34|#39);")


def _hostile(report: WeeklyReport) -> WeeklyReport:
    team = report.teams[0]
    reason = KeepReason(entity_id=EVIL, rule="idle", by=EVIL, reason=EVIL, until=datetime(2026, 1, 9, tzinfo=UTC),
                        gpu_hours=2.0, idle_share_pct=50.0, approved_by=EVIL)
    return report.model_copy(update={
        "team": EVIL,
        "teams": [team.model_copy(update={"team": EVIL, "owners": [o.model_copy(update={"owner": EVIL})
                                                                   for o in team.owners]}), *report.teams[1:]],
        "top_idle_jobs": [report.top_idle_jobs[0].model_copy(update={"name": EVIL, "owner": EVIL, "team": EVIL})],
        "rightsize": [RightsizeLine(workload=EVIL, owner=EVIL, team=EVIL, gpus=1, model=EVIL, fits="MIG 1g.10gb",
                                    saving_per_week=1.0, reason=EVIL)],
        "exemptions": [ExemptionLine(job=EVIL, user=EVIL, namespace=EVIL, exemption=EVIL, until=None,
                                     gpu_hours=1.0, idle_share_pct=None)],
        "keeps": [TeamKeeps(team=EVIL, count=1, at_budget=[EVIL], kept_gpu_hours=2.0, idle_share_pct=50.0,
                            reasons=[reason])],
    })


def _section(html: str, table_id: str) -> str:
    start = html.index(f'<table id="{table_id}">')
    return html[start:html.index("</table>", start)]


def test_a_hostile_name_is_escaped_once_in_every_section_of_the_weekly_report(tmp_path: Path) -> None:
    _fill(tmp_path / "u.sqlite")
    html = render_html(_hostile(_report(tmp_path / "u.sqlite")), CostModel(COSTS))
    assert "<script" not in html and EVIL not in html
    assert not TWICE.search(html), TWICE.search(html)
    assert f"<title>GPU usage report — team {ONCE}</title>" in html
    assert f"<h1>GPU usage report — team {ONCE}</h1>" in html
    assert f"<td>{ONCE}</td>" in _section(html, "teams")  # the team's row
    assert f'<td class="t">&nbsp;&nbsp;{ONCE}</td>' in _section(html, "teams")  # its owner's
    assert _section(html, "idle-jobs").count(ONCE) == 3  # job, owner, team
    assert _section(html, "rightsize").count(ONCE) == 4  # workload, owner, model, reason
    assert _section(html, "exemptions").count(ONCE) == 3  # job, user, exemption
    assert _section(html, "keeps").count(ONCE) == 6  # team, owner at budget, entity, by, approver, reason
    assert f'<td class="t">{ONCE}</td>' in _section(html, "energy")


def test_a_hostile_team_is_escaped_once_in_the_quarter_report(tmp_path: Path) -> None:
    qw.write_quarter(tmp_path / "usage.sqlite", simulated=False)
    q = qw.expected_quarter(tmp_path / "usage.sqlite")
    q = q.model_copy(update={"teams": [s.model_copy(update={"team": EVIL}) for s in q.teams]})
    html = render_quarter.render_html(q, qw.COSTS)
    assert "<script" not in html and EVIL not in html
    assert not TWICE.search(html), TWICE.search(html)
    assert f"<h2>{ONCE}</h2>" in html and f"<td class='t'>{ONCE}</td>" in html
