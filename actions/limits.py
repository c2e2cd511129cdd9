"""The fleet-wide `max_per_hour` guard per action type, shared by every runner through KV."""

from __future__ import annotations

from pydantic import BaseModel

from actions.store import KeyValue, kv_key
from gpuevents.bus import KvExists, KvWrongRevision

HOUR_S = 3600.0


class _Window(BaseModel):
    times: list[float] = []


async def take_hourly(kv: KeyValue, action_type: str, max_per_hour: int, now: float) -> bool:
    """Charge one run of `action_type` at `now` (epoch seconds); False when the rolling hour is full."""
    key = kv_key("actions", "limits", action_type)
    for _ in range(32):
        got = await kv.get(key)
        window = _Window() if got is None else _Window.model_validate_json(got.value)
        recent = [t for t in window.times if t > now - HOUR_S]
        if len(recent) >= max_per_hour:
            return False
        value = _Window(times=[*recent, now]).model_dump_json().encode()
        try:
            if got is None:
                await kv.create(key, value)
            else:
                await kv.update(key, value, last=got.revision)
        except (KvExists, KvWrongRevision):
            continue
        return True
    raise RuntimeError(f"could not charge the hourly limit of {action_type}: too much contention")
