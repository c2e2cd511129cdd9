"""Slack's formatting rules in one place: escaping machine text, and the Block Kit messages we send."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gpuevents.durations import format_duration
from gpuevents.facts import Facts, IncidentFacts

# The buttons' action ids (DESIGN §5.1): the message is built here, the clicks are read in actions/slack_clicks.py.
KEEP_PREFIX = "gpuevents_keep_"
RELEASE = "gpuevents_release"
NOT_MINE = "gpuevents_not_mine"


def keep_label(seconds: float) -> str:
    return f"Keep {format_duration(seconds)}"

# Slack's mrkdwn gives meaning to exactly these three characters: `<…>` makes links and mentions
# (`<!channel>`, `<!here>`, `<@U123>`), `&` starts an entity. Escaped, text shows as written.
_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})

MAX_BLOCKS = 50  # Slack rejects messages with more blocks
MAX_SECTION_TEXT = 3000


def escape(text: str) -> str:
    """Text from the machine (process names, command lines, pod names) as inert Slack text."""
    return text.translate(_ESCAPES)


def md(text: str) -> dict[str, Any]:
    """A mrkdwn text object, `verbatim`: Slack does not turn a plain `@here`, `#channel` or URL into a mention or
    a link (our own `<!date^…>` and escaped text are unaffected)."""
    return {"type": "mrkdwn", "text": text, "verbatim": True}


def truncate(text: str, limit: int = MAX_SECTION_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class MessageItem(BaseModel):
    """One incident as a message shows it; the digest is a list of these."""

    model_config = ConfigDict(frozen=True)

    text: str
    rule: str
    entity_id: str
    cluster: str = "default"
    incident_id: str = ""
    since: datetime | None = None
    firing_for: str | None = None
    cost: str | None = None
    where: str = ""
    processes: list[str] = Field(default_factory=list)
    next_type: str | None = None
    next_at: datetime | None = None
    next_says: str = ""  # "in 1 minute this will be logged, unless you keep it"
    cost_amount: float | None = None
    request: dict[str, Any] | None = None
    """The request this item came from (a digest with buttons: each item's buttons act on its own incident)."""
    buttons: list[float] | None = None  # keep durations of this item's buttons, when it has any


def describe_where(entity_id: str, facts: Facts) -> str:
    """`GPU 0 (NVIDIA H100) on node-7` and the like, escaped."""
    parts = []
    gpu, node, proc = facts.gpu, facts.node, facts.process
    if gpu is not None:
        model = f" ({gpu.model})" if gpu.model else ""
        parts.append(f"GPU {'?' if gpu.index is None else gpu.index}{model}")
    if proc is not None:
        who = f" of {proc.user}" if proc.user else ""
        parts.append(f"process {proc.name or '?'} (pid {'?' if proc.pid is None else proc.pid}){who}")
    node_name = node.name or (gpu.node if gpu is not None else None) or (proc.node if proc is not None else None)
    if node_name:
        parts.append(f"on {node_name}")
    return escape(" ".join(parts) if parts else entity_id)


def describe_processes(facts: Facts, limit: int = 10) -> list[str]:
    out = []
    for p in facts.processes[:limit]:
        user = f" ({p.user})" if p.user else ""
        out.append(escape(f"{p.name or '?'} pid {'?' if p.pid is None else p.pid}{user}"))
    if len(facts.processes) > limit:
        out.append(f"… and {len(facts.processes) - limit} more")
    return out


def make_item(text: str, rule: str, entity_id: str, cluster: str, incident_id: str, facts: Facts) -> MessageItem:
    inc = facts.incident or IncidentFacts()
    return MessageItem(
        text=text, rule=rule, entity_id=entity_id, cluster=cluster, incident_id=incident_id,
        since=inc.started_at or inc.firing_since, firing_for=inc.active_for or inc.firing_for,
        cost=escape(facts.cost.display() or "") or None if facts.cost else None,
        where=describe_where(entity_id, facts), processes=describe_processes(facts),
        next_type=inc.next.type if inc.next else None, next_at=inc.next.at if inc.next else None,
        next_says=inc.next.says if inc.next else "",
        cost_amount=facts.cost.amount if facts.cost else None,
    )


def snooze_hint(rule: str, entity_id: str) -> str:
    return f"`gpuevents snooze {rule} {escape(entity_id)} --for 4h`"


def _date(at: datetime) -> str:
    ts = int(at.timestamp())
    fallback = at.strftime("%Y-%m-%d %H:%M UTC")
    # Slack shows <!date^…> in the reader's own timezone.
    return f"<!date^{ts}^{{date_short_pretty}} {{time}}|{fallback}>"


def _since(item: MessageItem) -> str | None:
    return _date(item.since) if item.since is not None else None


def _fields(item: MessageItem) -> list[dict[str, Any]]:
    fields = [md(f"*Where*\n{item.where}"),
              md(f"*Rule*\n`{escape(item.rule)}`")]
    since = _since(item)
    if since:
        dur = f" ({escape(item.firing_for)})" if item.firing_for else ""
        fields.append(md(f"*Since*\n{since}{dur}"))
    if item.cost:
        fields.append(md(f"*Estimated cost so far*\n{item.cost}"))
    if item.next_type and item.next_at:
        says = item.next_says[:1].upper() + item.next_says[1:]
        what = f"{escape(says)} (at {_date(item.next_at)})" if says else \
            f"{escape(item.next_type)} at {_date(item.next_at)}"
        fields.append(md(f"*Next*\n{what}"))
    return fields


def incident_blocks(item: MessageItem, snooze: bool = True) -> list[dict[str, Any]]:
    """The Block Kit message for one incident: what, where, since when, cost, rule, how to snooze."""
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": md(truncate(item.text))},
        {"type": "section", "fields": _fields(item)},
    ]
    if item.processes:
        blocks.append({"type": "section", "text": md(truncate(
            "*Processes*\n" + "\n".join(f"• {p}" for p in item.processes)))})
    if snooze:
        blocks.append({"type": "context", "elements": [md(
                       f"Not waste? Snooze it: {snooze_hint(item.rule, item.entity_id)}")]})
    return blocks


def digest_blocks(items: list[MessageItem], window_s: float, snooze: bool = True,
                  currency: str = "USD") -> list[dict[str, Any]]:
    """One message listing several incidents of one owner, with what they cost together and, for items that
    have them, their own buttons; within Slack's 50 blocks ("… and 7 more" past that)."""
    total = sum(i.cost_amount for i in items if i.cost_amount is not None)
    money = f", about {total:,.2f} {escape(currency)} of idle GPU time so far" if total > 0 else ""
    head = (f"*{len(items)} GPU incident{'s' if len(items) != 1 else ''} for you*{money} "
            f"(collected over {format_duration(window_s)})")
    blocks: list[dict[str, Any]] = [{"type": "section", "text": md(head)}]
    per_item = 3 if any(i.buttons for i in items) else 2
    room = (MAX_BLOCKS - 2) // per_item
    for item in items[:room]:
        blocks.append({"type": "divider"})
        lines = [truncate(item.text, 1500), f"{item.where} · rule `{escape(item.rule)}`"]
        since = _since(item)
        if since:
            lines.append(f"since {since}" + (f" ({escape(item.firing_for)})" if item.firing_for else ""))
        if item.cost:
            lines.append(f"estimated cost so far: {item.cost}")
        if snooze:
            lines.append(f"snooze: {snooze_hint(item.rule, item.entity_id)}")
        blocks.append({"type": "section", "text": md(truncate("\n".join(lines)))})
        if item.buttons and item.request:
            blocks.append(button_block(str(item.request.get("key")), item.buttons, False, False))
    hidden = len(items) - room
    if hidden > 0:
        blocks.append({"type": "context", "elements": [md(f"… and {hidden} more")]})
    return blocks


def plain_text(item: MessageItem) -> str:
    """The notification text (what shows in the push notification, and on the console without a token)."""
    extra = [item.where, f"rule {item.rule}"]
    if item.cost:
        extra.append(f"est. cost {item.cost}")
    return f"{item.text} ({', '.join(extra)})"


def _button(text: str, action_id: str, value: str, style: str | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {"type": "button", "text": {"type": "plain_text", "text": text}, "action_id": action_id,
                         "value": value}
    if style:
        b["style"] = style
    return b


def button_block(request_key: str, keep: list[float], release: bool, not_mine: bool) -> dict[str, Any]:
    """The buttons of DESIGN §5.1; each carries the request key (how the click finds the message)."""
    elements = [_button(keep_label(s), f"{KEEP_PREFIX}{int(s)}", request_key, "primary" if i == 0 else None)
                for i, s in enumerate(keep[:4])]
    if release:
        elements.append(_button("Release now", RELEASE, request_key, "danger"))
    if not_mine:
        elements.append(_button("Not mine", NOT_MINE, request_key))
    return {"type": "actions", "block_id": "gpuevents_buttons", "elements": elements}


def buttons_text(item: MessageItem, keep: list[float], release: bool, not_mine: bool) -> str:
    """The buttons as the console shows them without a Slack token, with the command that does the same."""
    parts = [f"[{keep_label(s)}]" for s in keep[:4]]
    if release:
        parts.append("[Release now]")
    if not_mine:
        parts.append("[Not mine]")
    hint = ""
    if keep:
        hint = (f" — a keep from a terminal: gpuevents keep {item.rule} {item.entity_id} {format_duration(keep[0])}"
                " --reason WHY")
    return " ".join(parts) + hint
