"""The bus: the one package that imports nats-py. `Bus` is the connection; the other names are what its
users handle (messages, subscriptions, deliveries, KV entries, publish items) and the errors it raises."""

from gpuevents.bus.connection import CLIENT_CONNECT_S, Bus
from gpuevents.bus.consumer import Consumer, Delivery
from gpuevents.bus.errors import (
    BusError,
    BusNoResponders,
    BusStoreFull,
    BusTimeout,
    BusUnreachable,
    KvExists,
    KvWrongRevision,
)
from gpuevents.bus.kv import Kv, KvEntry
from gpuevents.bus.publishing import BusStats, PublishItem
from gpuevents.bus.replay import StoredMsg
from gpuevents.bus.serving import Handler, Listener, Message, Subscription, error_reply

__all__ = [
    "CLIENT_CONNECT_S",
    "Bus",
    "BusError",
    "BusNoResponders",
    "BusStats",
    "BusStoreFull",
    "BusTimeout",
    "BusUnreachable",
    "Consumer",
    "Delivery",
    "Handler",
    "Kv",
    "KvEntry",
    "KvExists",
    "KvWrongRevision",
    "Listener",
    "Message",
    "PublishItem",
    "StoredMsg",
    "Subscription",
    "error_reply",
]
