"""Machine values in `notify` messages: marked at rendering, escaped at the run for the service the URL names
(Markdown, chat cards, Slack, text, e-mail and JSON as they are), pings broken everywhere a chat reads them; the
rule author's own text is never touched."""

from __future__ import annotations

import pytest

from actions.notify_format import CLOSE, OPEN, finish, kind_of, mark, unmark

ZWSP = "\u200b"


@pytest.mark.parametrize(("url", "kind"), [
    ("discord://id/token", "markdown"), ("MMOSTS://host/token", "markdown"), ("gchat://w/k/t", "chat"),
    ("workflows://host/x", "chat"), ("slack://T/B/C", "slack"), ("mailtos://u:p@host", "email"),
    ("jsons://host/path", "data"), ("ntfy://topic", "text"), ("newchat://x", "markdown"),
])
def test_the_url_scheme_says_what_the_service_interprets(url: str, kind: str) -> None:
    assert kind_of(url) == kind


def test_only_the_marked_value_is_escaped_for_markdown() -> None:
    text = f"**GPU idle** held by {mark('evil_[x](http://a) @everyone')}"
    assert finish(text, "markdown") == rf"**GPU idle** held by evil\_\[x\]\(http://a\) @{ZWSP}everyone"


def test_chat_cards_get_broken_links_and_pings_not_backslashes() -> None:
    assert finish(mark("[x](http://a) <users/all> @here"), "chat") == \
        f"[x]{ZWSP}(http://a) <{ZWSP}users/all> @{ZWSP}here"


def test_slack_gets_its_entities_and_no_pings() -> None:
    out = finish(mark("<!channel> & a>b"), "slack")
    assert "<!channel>" not in out and "&amp;" in out and "&gt;" in out


@pytest.mark.parametrize("kind", ["email", "data"])
def test_email_and_json_take_the_value_as_it_is(kind: str) -> None:
    assert finish("x " + mark("<b>@all</b>"), kind) == "x <b>@all</b>"  # type: ignore[arg-type]  # kind: the parametrized str


def test_a_value_cannot_forge_or_close_a_mark() -> None:
    hostile = f"a{CLOSE}@channel{OPEN}b"
    out = finish(mark(hostile), "text")
    assert out == f"a@{ZWSP}channelb" and OPEN not in out and CLOSE not in out


def test_unmark_gives_values_as_people_read_them_inside_lists_and_mappings() -> None:
    assert unmark({"to": [mark("alice")], "n": 3, "t": f"x {mark('y')}"}) == {"to": ["alice"], "n": 3, "t": "x y"}
