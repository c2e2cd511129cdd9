"""The `keep` action is the engine's (an owner's keep past snooze_max, once approved): a rule that writes it is
told so by `rules check`, with the line. Its run is tested end to end in tests/actions/test_slack_clicks.py."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from gpuevents.cli import app


def test_rules_check_says_a_keep_action_is_not_written_in_rules(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("rules:\n  - name: x\n    entity: gpu\n    when: gpu.idle\n    actions:\n      - type: keep\n")
    result = CliRunner().invoke(app, ["rules", "check", str(f)])
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        f"{f}:6: actions[0].type: `keep` is not written in rules: the engine asks it for an owner's keep past the "
        "rule's snooze_max; to let owners keep, give a slack action `buttons: {keep: [4h, 24h]}`")
    assert "keep.until" not in result.output
