"""A staged remedy waits for its warning to be delivered; a rule whose warnings have no real channel (no Slack
token, a notify service with no URL) refuses to load at the staged action's line, unless it runs dry (DESIGN §3.4).
The engine loads through `load_checked` with its config, so this is what `gpuevents engine` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuevents.config import Config
from gpuevents.yamlpos import LocatedError
from rules.intake.check import load_checked

RULE = """\
rules:
  - name: reclaim
    entity: process
    when: process.gpus
{extra}    actions:
      - type: {warning}
        to: {to}
        text: "your GPU idles"
      - type: kill
        after: 10m
{kill_extra}"""


def _write(tmp_path: Path, warning: str = "slack", to: str = "alice@example.org", extra: str = "",
           kill_extra: str = "") -> Path:
    f = tmp_path / "r.yaml"
    f.write_text(RULE.format(warning=warning, to=to, extra=extra, kill_extra=kill_extra))
    return f


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLACK_BOT_TOKEN", raising=False)
    monkeypatch.delenv("PD_URL", raising=False)


def test_a_staged_kill_after_a_slack_warning_without_a_token_refuses_to_load(tmp_path: Path) -> None:
    f = _write(tmp_path)
    with pytest.raises(LocatedError) as e:
        load_checked([f], config=Config())
    [problem] = e.value.problems
    assert (problem.file, problem.line) == (str(f), 9)
    assert "reclaim: actions[1] (kill)" in problem.message and "$SLACK_BOT_TOKEN" in problem.message


def test_with_a_token_it_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", "xoxb-1")
    assert [r.name for r in load_checked([_write(tmp_path)], config=Config())] == ["reclaim"]


def test_a_dry_run_rule_or_engine_loads_without_a_channel(tmp_path: Path) -> None:
    assert load_checked([_write(tmp_path, extra="    dry_run: true\n")], config=Config())
    assert load_checked([_write(tmp_path)], config=Config.model_validate({"engine": {"dry_run": True}}))


def test_a_remedy_that_does_not_wait_for_a_warning_loads(tmp_path: Path) -> None:
    assert load_checked([_write(tmp_path, kill_extra="        require_warning: false\n")], config=Config())


def test_a_notify_service_without_its_url_is_named_with_the_variable_to_set(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    config = Config.model_validate({"actions": {"notify": {"services": {"pd": {"url_env": "PD_URL"}}}}})
    f = _write(tmp_path, warning="notify", to="pd")
    with pytest.raises(LocatedError) as e:
        load_checked([f], config=config)
    assert "notify pd: set $PD_URL" in e.value.problems[0].message
    monkeypatch.setenv("PD_URL", "pagerduty://a@b")
    assert load_checked([f], config=config)


def test_one_warning_with_a_channel_is_enough(tmp_path: Path) -> None:
    text = RULE.format(warning="slack", to="alice@example.org", extra="", kill_extra="").replace(
        "      - type: kill",
        "      - type: email\n        to: alice@example.org\n        subject: s\n        text: x\n      - type: kill")
    f = tmp_path / "r.yaml"
    f.write_text(text)
    assert load_checked([f], config=Config())
