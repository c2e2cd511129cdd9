"""The acting engine's part in a person's remedy or its undo: decide it in the core (rules.core.manual), send it to the
runners with the limit windows it changed, and audit the request with who asked."""

from __future__ import annotations

from datetime import datetime

from gpuevents.config import Config
from gpuevents.events import new_id
from gpuevents.wire.manual import RESTORES, OperatorAction, OperatorActionReply
from rules.core import manual
from rules.core.core import Core, StepResult
from rules.engine.audit import request_record
from rules.engine.commit import Committer


async def act_for(req: OperatorAction, core: Core, config: Config, committer: Committer, now: datetime,
                  partition: int | None) -> OperatorActionReply | None:
    """The decision, committed and audited; None when the target is not in this engine's part of the fleet (another
    partition's engine answers), an error reply when no engine can know it."""
    ent = manual.find_target(core.state, req)
    if ent is None and req.type not in RESTORES:
        return None if partition is not None else manual.unknown_target(req)
    if ent is None and partition not in (None, 0):
        return None  # an undo of a target no engine sees: the first partition's engine answers it
    request = manual.decide(req, ent, config, core.limiter, now, new_id())
    limits = core.limiter.windows(now.timestamp()) if core.limiter.dirty else None
    result = StepResult(actions=[request], limits=limits)
    await committer.commit(result, "commit a person's action")
    request = result.actions[0]  # as committed: held when its site is cut off
    await committer.audit([request_record(now, req.by, request)])
    return manual.reply_for(request)
