"""The `report` action: each team's weekly summary posted to its channel, through the real Slack client.

The summary comes from the rollups store through `Services.report`, as the composition root wires it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from actions import registry
from actions.builtin.report import ReportAction
from actions.protocol import ActionContext, ActionResult, PermanentError
from actions.services import Services
from actions.specs.report import ReportParams, ReportSpec
from gpuevents.cli.report import weekly_summary
from gpuevents.clock import ManualClock
from gpuevents.config import Config
from gpuevents.records import ActionRequest
from tests.actions.fakes import FakeSlack
from tests.rules.usage.test_weekly import COSTS, NOW, _fill


@pytest.fixture
async def slack() -> AsyncIterator[FakeSlack]:
    server = FakeSlack([])
    await server.start()
    try:
        yield server
    finally:
        await server.close()


def _ctx(config: Config, params: dict[str, object], wired: bool = True) -> ActionContext:
    request = ActionRequest.model_validate({
        "key": "inc-1:fire:0:0", "type": "report", "params": {"type": "report", **params}, "rule": "weekly-report",
        "entity_id": "n1", "entity_kind": "node", "incident_id": "inc-1", "created_at": NOW,
    })
    services = Services(config, clock=ManualClock(NOW), report=weekly_summary if wired else None)
    return ActionContext(request=request, params=ReportParams.model_validate(request.params), config=config,
                         services=services)


async def _run(ctx: ActionContext) -> ActionResult:
    assert isinstance(ctx.params, ReportParams)
    return await ReportAction().run(ctx.params, ctx)


def _config(db: Path, slack_url: str | None = None) -> Config:
    return Config.model_validate({
        "engine": {"usage_db": str(db)},
        "costs": COSTS.model_dump(),
        "actions": {"slack": {"base_url": slack_url, "token_env": "TEST_REPORT_SLACK_TOKEN"}},
    })


def test_report_is_a_registered_action() -> None:
    assert "report" in registry.types()
    assert registry.get("report") is ReportSpec and registry.runtime("report") is ReportAction
    assert ReportAction.destructive is False


def test_params_need_somewhere_to_post() -> None:
    with pytest.raises(ValidationError, match="channels"):
        ReportParams.model_validate({"type": "report"})


async def test_each_team_summary_goes_to_its_channel(
    tmp_path: Path, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_REPORT_SLACK_TOKEN", "xoxb-test")
    _fill(tmp_path / "u.sqlite", extra_pod="ns/<!channel>")
    ctx = _ctx(_config(tmp_path / "u.sqlite", slack.base_url),
               {"channels": {"vision": "#vision-gpus", "nlp": "#nlp", "absent": "#nobody"}, "to": "#gpu-fleet",
                "top_jobs": 5})
    result = await _run(ctx)
    assert result.status == "ok"
    by_channel = {p["channel"]: p["text"] for p in slack.posted}
    assert set(by_channel) == {"#vision-gpus", "#nlp", "#gpu-fleet"}  # a team with no usage gets nothing
    vision = by_channel["#vision-gpus"]
    assert "team *vision*" in vision
    assert "*$16.87*" in vision and "alice@example.com 4.0 h ($16.87)" in vision
    assert "vision/train-1 on n1 GPU 0" in vision
    assert "$3.60" in by_channel["#nlp"] and "alice" not in by_channel["#nlp"]
    fleet = by_channel["#gpu-fleet"]
    assert "for the fleet" in fleet
    assert "<!channel>" not in fleet and "ns/&lt;!channel&gt;" in fleet
    assert slack.posted[0]["blocks"][0]["text"]["type"] == "mrkdwn"


async def test_without_a_token_the_summaries_are_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TEST_REPORT_SLACK_TOKEN", raising=False)
    _fill(tmp_path / "u.sqlite")
    result = await _run(_ctx(_config(tmp_path / "u.sqlite"), {"to": "#gpu-fleet"}))
    assert "1 summaries printed" in result.detail
    assert "[slack → #gpu-fleet] *Weekly GPU usage for the fleet*" in capsys.readouterr().out


async def test_no_usage_store_is_a_permanent_error(tmp_path: Path) -> None:
    with pytest.raises(PermanentError, match="no usage recorded yet"):
        await _run(_ctx(_config(tmp_path / "missing.sqlite"), {"to": "#x"}))


async def test_a_runner_without_the_summary_refuses_for_good(tmp_path: Path) -> None:
    _fill(tmp_path / "u.sqlite")
    with pytest.raises(PermanentError, match="needs the weekly usage summary"):
        await _run(_ctx(_config(tmp_path / "u.sqlite"), {"to": "#x"}, wired=False))
