"""NATS subjects, stream names and KV keys (DESIGN §2), with one reversible escape for tokens that are not valid."""

from __future__ import annotations

import re
from typing import NamedTuple

PREFIX = "gpuevents"
STREAM_EVENTS = "GPUEVENTS"
STREAM_ACTIONS = "GPUEVENTS_ACT"
STREAM_AUDIT = "GPUEVENTS_AUDIT"
STREAM_DLQ = "GPUEVENTS_DLQ"
STREAM_SITE = "GPUEVENTS_SITE"  # a site's own store, in its leaf's JetStream domain, sourced into GPUEVENTS
KV_BUCKET = "gpuevents-state"
# The operator (the command line) reads the audit stream through consumers of these names only, so its NATS
# login may create, read and delete those and no other (an exporter's durable consumer stays out of its reach).
OPERATOR_CONSUMERS = tuple(f"gpuevents-operator-{i}" for i in range(8))

EVENTS_ALL = f"{PREFIX}.evt.>"
ACTIONS_ALL = f"{PREFIX}.act.>"
AUDIT_ALL = f"{PREFIX}.audit.>"
DLQ_ALL = f"{PREFIX}.dlq.>"

# Kept as they are: letters, digits, '-' and '_'. Everything else, the escape mark included, becomes
# <mark>XX of its UTF-8 bytes, so any name maps to exactly one token and back. Subjects mark with '%';
# KV keys, which do not allow '%', with '='.
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]+")
_ESCAPED = re.compile(r"((?:%[0-9A-F]{2})+)")


class SubjectError(ValueError):
    """A subject that is not one of ours."""


def _escape(name: str, mark: str) -> str:
    return _UNSAFE.sub(lambda m: "".join(f"{mark}{b:02X}" for b in m.group(0).encode("utf-8")), name)


def escape_token(name: str) -> str:
    """`name` as one valid subject token; `unescape_token` reverses it."""
    if name == "":
        raise SubjectError("a subject token cannot be empty")
    return _escape(name, "%")


def kv_token(name: str) -> str:
    """`name` as one token of a KV key (keys are tokens joined by dots): the subject escape with `=XX`
    for `%XX`, since a KV key may not hold `%`; `=` alone for the empty name."""
    return _escape(name, "=") or "="


def incident_kv_key(rule: str, entity_key: str) -> str:
    """Where the engine keeps an open incident of `rule` on the entity with that key (absent once it closed)."""
    return f"incident.{kv_token(rule)}.{kv_token(entity_key)}"


def unescape_token(token: str) -> str:
    return _ESCAPED.sub(lambda m: bytes.fromhex(m.group(1).replace("%", "")).decode("utf-8"), token)


class EventSubject(NamedTuple):
    cluster: str
    node: str
    type: str


def event_subject(cluster: str, node: str, event_type: str) -> str:
    """`gpuevents.evt.<cluster>.<node>.<type>`; the type keeps its own dots (`gpu.idle`)."""
    return f"{PREFIX}.evt.{escape_token(cluster)}.{escape_token(node)}.{event_type}"


def partition_transform(partitions: int) -> tuple[str, str]:
    """The stream subject transform that stores `gpuevents.evt.<cluster>.<node>.<type>` as
    `gpuevents.evt.<partition>.<cluster>.<node>.<type>`, the partition a hash of cluster and node (NATS's
    deterministic subject-mapping partition)."""
    return (f"{PREFIX}.evt.*.*.>",
            f"{PREFIX}.evt.{{{{partition({partitions},1,2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}.>")


def node_partition(cluster: str, node: str, partitions: int) -> int:
    """The partition NATS stores a node's events in: FNV-1a (32-bit) of the escaped cluster and node tokens,
    concatenated, modulo `partitions` (as the server's `partition()` transform computes it)."""
    h = 0x811C9DC5
    for b in (escape_token(cluster) + escape_token(node)).encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def partition_filter(partition: int) -> str:
    """The stored events of one partition (when the stream is partitioned)."""
    return f"{PREFIX}.evt.{partition}.>"


def stored_event_subject(cluster: str, node: str, event_type: str, partition: int | None) -> str:
    """The subject an event is stored under: as published, or with its partition token after `evt`."""
    if partition is None:
        return event_subject(cluster, node, event_type)
    return f"{PREFIX}.evt.{partition}.{escape_token(cluster)}.{escape_token(node)}.{event_type}"


def cluster_events_filter(cluster: str) -> str:
    """Every event of one cluster (a site): `gpuevents.evt.<cluster>.>`."""
    return f"{PREFIX}.evt.{escape_token(cluster)}.>"


def site_deliver_prefix(cluster: str) -> str:
    """Where a site's store delivers to the hub's stream (the source's `deliver` prefix): the site's link may
    publish there and on no other site's."""
    return f"{PREFIX}.src.{escape_token(cluster)}"


def jetstream_api(domain: str | None) -> str:
    """The JetStream API prefix of a domain (`$JS.<domain>.API`), or the server's own (`$JS.API`)."""
    return f"$JS.{domain}.API" if domain else "$JS.API"


def node_events_filter(cluster: str, node: str) -> str:
    return f"{PREFIX}.evt.{escape_token(cluster)}.{escape_token(node)}.>"


def parse_event_subject(subject: str) -> EventSubject:
    parts = subject.split(".")
    if len(parts) < 5 or parts[0] != PREFIX or parts[1] != "evt":
        raise SubjectError(f"not an event subject: {subject!r}")
    return EventSubject(unescape_token(parts[2]), unescape_token(parts[3]), ".".join(parts[4:]))


def command_subject(cluster: str, node: str, verb: str) -> str:
    """`gpuevents.cmd.<cluster>.<node>.<verb>`: request/reply to one agent."""
    return f"{PREFIX}.cmd.{escape_token(cluster)}.{escape_token(node)}.{escape_token(verb)}"


def node_commands_filter(cluster: str, node: str) -> str:
    return f"{PREFIX}.cmd.{escape_token(cluster)}.{escape_token(node)}.*"


def action_subject(action_type: str) -> str:
    """`gpuevents.act.<type>`; plugin types keep their dots (`acme.preempt`)."""
    return f"{PREFIX}.act.{'.'.join(escape_token(p) for p in action_type.split('.'))}"


def audit_subject(rule: str) -> str:
    return f"{PREFIX}.audit.{escape_token(rule)}"


def function_subject(name: str) -> str:
    return f"{PREFIX}.fn.{'.'.join(escape_token(p) for p in name.split('.'))}"


def dlq_subject(original: str) -> str:
    """Where a malformed message from `original` goes: `gpuevents.dlq.<original without prefix>`."""
    rest = original.removeprefix(f"{PREFIX}.")
    tokens = [t for t in rest.split(".") if t] or ["unknown"]
    return f"{PREFIX}.dlq." + ".".join(tokens)


ENGINE_STATUS = f"{PREFIX}.engine.status"
"""Request/reply: every acting engine answers with its part of the fleet and its open incidents (`StatusQuery`;
the replies in gpuevents/wire/status.py)."""
ENGINE_SNOOZE = f"{PREFIX}.engine.snooze"
"""Request/reply: the acting engine applies a snooze or a keep (`KeepRequest`, `KeepReply`)."""
ENGINE_FREE = f"{PREFIX}.engine.free"
"""Request/reply: every acting engine answers `gpuevents free` for its part of the fleet (`FreeQuery`, `FreeReply`)."""
ENGINE_ACT = f"{PREFIX}.engine.act"
"""Request/reply: a person's kill or cancel (`gpuevents kill`, `gpuevents cancel`), decided by the acting engine
like a rule's action."""
ENGINE_REQUESTS = f"{PREFIX}.engine.>"

ROLES = ("agent", "engine", "runner", "operator", "admin")
"""The NATS identities of DESIGN §7.1, each with its own reply inbox."""


def inbox_prefix(role: str, node: str | None = None, cluster: str | None = None) -> str:
    """Where a role's replies come back: `_INBOX.<role>`, an agent's `_INBOX.agent.<cluster>.<node>` (the site in
    it, so two sites' same-named nodes never share one). The generated NATS users (deploy/nats/nats_auth.py) may
    subscribe to their own prefix only, so no one reads another's replies."""
    if role not in ROLES:
        raise ValueError(f"unknown NATS role {role!r}; one of {', '.join(ROLES)}")
    if role == "agent":
        if not node or not cluster:
            raise ValueError("an agent's inbox prefix names its cluster and node")
        return f"_INBOX.agent.{escape_token(cluster)}.{escape_token(node)}"
    return f"_INBOX.{role}"
