"""Slack's formatting rules: escaping and the Block Kit layout."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from actions import slack_format as fmt
from gpuevents.facts import Facts
from tests.actions.conftest import T0


def test_escape_neutralises_mentions_links_and_entities() -> None:
    assert fmt.escape("<!channel> <@U1> <https://x|y> a&b") == \
        "&lt;!channel&gt; &lt;@U1&gt; &lt;https://x|y&gt; a&amp;b"


def test_incident_message_says_what_where_since_cost_rule_and_how_to_snooze() -> None:
    item = fmt.make_item("GPU idle", "idle-gpu-2h", "n1/gpu0", "default", "inc1", Facts.model_validate({
        "node": {"name": "n1"}, "gpu": {"index": 0, "model": "H100"},
        "incident": {"firing_since": T0.isoformat(), "firing_for": "2h"},
        "cost": {"amount": 3.5, "currency": "EUR", "text": "€3.50"},
        "processes": [{"pid": 1, "user": "a", "name": "<!here>"}]}))
    text = json.dumps(fmt.incident_blocks(item), ensure_ascii=False)
    assert "GPU 0 (H100) on n1" in text and "idle-gpu-2h" in text and "€3.50" in text
    assert f"<!date^{int(T0.timestamp())}^" in text  # Slack shows it in the reader's timezone
    assert "gpuevents snooze idle-gpu-2h n1/gpu0 --for 4h" in text
    assert "&lt;!here&gt;" in text and "<!here>" not in text


def test_digest_lists_every_item_and_stays_under_slacks_block_limit() -> None:
    items = [fmt.make_item(f"GPU {i} idle", "r", f"n1/gpu{i}", "default", f"i{i}", Facts()) for i in range(60)]
    blocks = fmt.digest_blocks(items, 900)
    assert len(blocks) <= fmt.MAX_BLOCKS
    # a heading, 24 items of two blocks and the "more" line: all 50 blocks Slack allows
    assert "60 GPU incidents for you" in json.dumps(blocks[0]) and "and 36 more" in json.dumps(blocks[-1])


def test_the_message_says_when_the_next_staged_action_runs() -> None:
    from actions.slack_format import incident_blocks, make_item

    at = datetime(2026, 12, 7, 11, 30, tzinfo=UTC)
    item = make_item("GPU 0 idle", "idle-gpu-2h", "n1/gpu0", "default", "inc-1",
                     Facts.model_validate({"incident": {"firing_since": "2026-12-07T11:00:00+00:00",
                                                        "next": {"type": "kill", "at": at.isoformat(), "in": "30m"}}}))
    text = str(incident_blocks(item))
    assert f"*Next*\\nkill at <!date^{int(at.timestamp())}^" in text


def test_the_next_line_says_in_words_what_will_happen() -> None:
    from actions.slack_format import incident_blocks, make_item

    at = datetime(2026, 12, 7, 11, 30, tzinfo=UTC)
    says = "in 1 minute this will be logged, unless you keep it"
    item = make_item("GPU 0 idle", "r", "n1/gpu0", "default", "inc-1",
                     Facts.model_validate({"incident": {"next": {"type": "log", "at": at.isoformat(), "in": "1m",
                                                                 "says": says}}}))
    text = str(incident_blocks(item))
    assert "*Next*\\nIn 1 minute this will be logged, unless you keep it (at <!date^" in text
    assert "log at" not in text


def test_the_console_shows_the_buttons_and_the_keep_command_with_its_reason() -> None:
    item = fmt.MessageItem(text="idle", rule="idle-held", entity_id="n1/gpu0")
    assert fmt.buttons_text(item, [14400, 86400], True, False) == (
        "[Keep 4h] [Keep 1d] [Release now] — a keep from a terminal: gpuevents keep idle-held n1/gpu0 4h --reason WHY")
