"""The `power_cap` command on `gpuevents.cmd.<cluster>.<node>.power_cap`: a held-idle GPU's power limit lowered
(NVML `nvmlDeviceSetPowerManagementLimit`, within the GPU's own bounds), and put back.

A cap is checked as a kill is: the GPU is still the one named, idle in the latest sample, held by exactly the
processes named (pid and create time), none protected, within this node's rate. It is put back when the GPU
turns active, when one of those processes ends, on a `restore` command (the incident resolved), and when the
agent stops. Every cap is written to `agent.state_dir` before the limit is lowered, so an agent that crashed
puts the limits back when it starts again; a limit someone changed since is left as it is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from agent.core import NodeCore
from agent.kill import KillPolicy, RateLimit
from agent.sample import LiveProcess, PowerControl, PowerLimitError
from gpuevents.commands import CREATE_TIME_TOLERANCE_S, PowerCapCommand, PowerCapReply

if TYPE_CHECKING:
    from gpuevents.bus import Message

log = logging.getLogger(__name__)


@dataclass
class Cap:
    """A limit this agent lowered: enough to put it back, and to tell what the cap saves."""

    uuid: str
    index: int
    original_w: float
    cap_w: float
    processes: list[tuple[int, float]]  # (pid, create time as epoch seconds)
    power_before_w: float | None  # the draw when it was capped
    rule: str
    since: float


class CapFile:
    """`power-caps-<node>.json` in `agent.state_dir`: the caps in force, written before each change."""

    def __init__(self, directory: Path, node: str) -> None:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in node)
        self.path = directory / f"power-caps-{safe}.json"

    def load(self) -> list[Cap]:
        try:
            raw = json.loads(self.path.read_text())
            return [Cap(**{**c, "processes": [tuple(p) for p in c["processes"]]}) for c in raw["caps"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.error("cannot read the power caps in %s (%s): the limits they name are not put back", self.path, e)
            return []

    def save(self, caps: list[Cap]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"caps": [asdict(c) for c in caps]}))
        os.replace(tmp, self.path)


class PowerCapper:
    """Answers power-cap commands for one node and puts limits back; `check` runs after every sample."""

    def __init__(self, control: PowerControl | None, core: NodeCore, policy: KillPolicy, rate: RateLimit, *,
                 state: CapFile | None = None, dry_run: bool = False) -> None:
        self.control = control
        self.core = core
        self.policy = policy
        self.rate = rate
        self.state = state
        self.dry_run = dry_run
        self.caps: dict[int, Cap] = {}
        self._lock = threading.Lock()  # commands come on the loop, checks from the sampling thread

    # ------------------------------------------------------------ commands
    async def answer(self, msg: Message) -> bytes:
        try:
            cmd = PowerCapCommand.model_validate_json(msg.data)
        except ValidationError as e:
            return PowerCapReply(outcome="refused", index=-1, reason=f"malformed power_cap command: {e}") \
                .model_dump_json().encode()
        reply = await asyncio.to_thread(self.handle, cmd)  # NVML calls: off the loop
        return reply.model_dump_json().encode()

    def handle(self, cmd: PowerCapCommand) -> PowerCapReply:
        with self._lock:
            reply = self._restore_cmd(cmd) if cmd.restore else self._cap(cmd)
        log.warning("power_cap gpu %d (rule %s, key %s): %s%s", cmd.index, cmd.rule or "-", cmd.key or "-",
                    reply.outcome, f" ({reply.reason})" if reply.reason else "")
        return reply

    def _cap(self, cmd: PowerCapCommand) -> PowerCapReply:
        i = cmd.index

        def refused(reason: str) -> PowerCapReply:
            return PowerCapReply(outcome="refused", index=i, reason=reason)

        why = self._refusal(cmd)
        if why is not None:
            return refused(why)
        if i in self.caps:
            return PowerCapReply(outcome="unchanged", index=i, limit_w=self.caps[i].cap_w,
                                 reason="already capped by gpuevents")
        assert self.control is not None  # _refusal says so otherwise
        try:
            low, high = self.control.power_bounds(i)
            current = self.control.power_limit(i)
        except PowerLimitError as e:
            return refused(f"cannot read its power limits: {e}")
        target = max(low, min(high, cmd.watts if cmd.watts is not None else low))
        if target >= current:
            return PowerCapReply(outcome="unchanged", index=i, limit_w=current, previous_w=current,
                                 reason=f"its limit is already {current:g} W, at or below {target:g} W")
        if not self.rate.take():
            return refused("power caps are disabled on this node (agent.power_cap.max_per_minute: 0)"
                           if self.rate.per_minute == 0 else
                           f"rate limit: at most {self.rate.per_minute} power caps per minute on this node")
        note = f"raised to the GPU's minimum {low:g} W" if cmd.watts is not None and cmd.watts < low else ""
        if self.dry_run:
            return PowerCapReply(outcome="capped", index=i, limit_w=target, previous_w=current, dry_run=True,
                                 reason="dry run (agent.power_cap.dry_run): the limit was not set")
        reading = self.core.readings.get(i)
        cap = Cap(uuid=cmd.uuid or (reading.uuid if reading else ""), index=i, original_w=current, cap_w=target,
                  processes=[(p.pid, p.create_time.timestamp()) for p in cmd.processes],
                  power_before_w=reading.power_w if reading else None, rule=cmd.rule,
                  since=(self.core.now or datetime.now().astimezone()).timestamp())
        self.caps[i] = cap
        if not self._save():  # before the change: a crash after it must find the cap
            del self.caps[i]
            return refused(f"cannot record the cap in {self.state.path if self.state else '-'}: not set")
        try:
            self.control.set_power_limit(i, target)
        except PowerLimitError as e:
            del self.caps[i]
            self._save()
            return refused(f"the driver would not set {target:g} W: {e}")
        return PowerCapReply(outcome="capped", index=i, limit_w=target, previous_w=current, reason=note)

    def _refusal(self, cmd: PowerCapCommand) -> str | None:
        """Why this GPU must not be capped now, or None (the identity checks of kill, and then some)."""
        if self.control is None:
            return "this sampler cannot set power limits"
        if self.state is None:
            return "power caps need agent.state_dir, where a restarted agent finds the limits to put back"
        if self.policy.node_protected:
            return "this node is protected (protect.node_labels)"
        r = self.core.readings.get(cmd.index)
        if r is None or r.lost:
            return f"no GPU {cmd.index} in the latest sample" if r is None else "the GPU is lost"
        if cmd.uuid and r.uuid != cmd.uuid:
            return f"GPU {cmd.index} is {r.uuid}, not {cmd.uuid}"
        if r.mig_parent is not None:
            return "a MIG instance shares its GPU's power limit: not capped alone"
        st = self.core.gpu_states.get(cmd.index)
        if st is None or not st.idle:
            return "it is not idle in the latest sample"
        held = {(h.ident.pid, h.ident.create_time.timestamp()): h for h in self.core.processes_on(cmd.index)}
        if not cmd.processes:
            return "no process named: a cap is for a GPU somebody holds idle"
        named = {(p.pid, p.create_time.timestamp()) for p in cmd.processes}
        if not _same(named, set(held)):
            return "the processes on it are not the ones named (one ended, or another started)"
        for h in held.values():
            live = LiveProcess(pid=h.ident.pid, create_time=h.ident.create_time, user=h.ident.user,
                               name=h.ident.name, exe=h.ident.exe)
            why = self.policy.refusal(h.ident.pid, live, h.ident.pod)
            if why is not None:
                return why
        return None

    def _restore_cmd(self, cmd: PowerCapCommand) -> PowerCapReply:
        cap = self.caps.get(cmd.index)
        if cap is None or (cmd.uuid and cap.uuid != cmd.uuid):
            return PowerCapReply(outcome="unchanged", index=cmd.index, reason="gpuevents has no cap on it")
        return self._put_back(cap, f"restore asked (rule {cmd.rule or '-'})")

    # ------------------------------------------------------------ putting back
    def check(self) -> list[PowerCapReply]:
        """After a sample: put back the limits of GPUs that turned active, or whose holders changed."""
        out = []
        with self._lock:
            for cap in list(self.caps.values()):
                why = self._over(cap)
                if why is not None:
                    out.append(self._put_back(cap, why))
        return out

    def _over(self, cap: Cap) -> str | None:
        r = self.core.readings.get(cap.index)
        if r is None or r.lost or r.uuid != cap.uuid:
            return "the GPU is gone"
        st = self.core.gpu_states.get(cap.index)
        if st is None or not st.idle:
            return "the GPU is active"
        held = {(h.ident.pid, h.ident.create_time.timestamp()) for h in self.core.processes_on(cap.index)}
        if not _same(set(cap.processes), held):
            return "its holders changed"
        return None

    def _put_back(self, cap: Cap, why: str) -> PowerCapReply:
        assert self.control is not None
        try:
            now = self.control.power_limit(cap.index)
            if abs(now - cap.cap_w) > 0.5:
                reply = PowerCapReply(outcome="unchanged", index=cap.index, limit_w=now,
                                      reason=f"{why}; its limit is {now:g} W, not the cap: left as it is")
            else:
                self.control.set_power_limit(cap.index, cap.original_w)
                reply = PowerCapReply(outcome="restored", index=cap.index, limit_w=cap.original_w,
                                      previous_w=cap.cap_w, reason=why)
        except PowerLimitError as e:
            log.error("gpu %d: cannot put its power limit back to %g W (%s): %s", cap.index, cap.original_w, why, e)
            return PowerCapReply(outcome="refused", index=cap.index, reason=f"{why}; the driver refused: {e}")
        self.caps.pop(cap.index, None)
        self._save()
        log.warning("power_cap gpu %d: %s (%s)", cap.index, reply.outcome, reply.reason)
        return reply

    def restore_all(self, why: str) -> list[PowerCapReply]:
        with self._lock:
            return [self._put_back(cap, why) for cap in list(self.caps.values())]

    def recover(self) -> list[PowerCapReply]:
        """At start: put back the limits a previous run capped (it stopped without doing so)."""
        if self.state is None or self.control is None:
            return []
        with self._lock:
            self.caps = {c.index: c for c in self.state.load()}
        return self.restore_all("left capped by the agent's previous run")

    def cap_of(self, index: int) -> tuple[float, float | None] | None:
        """The cap on this GPU and the draw before it, or None (for snapshots: `power_cap_w`, the saving)."""
        cap = self.caps.get(index)
        return None if cap is None else (cap.cap_w, cap.power_before_w)

    def _save(self) -> bool:
        if self.state is None:
            return True
        try:
            self.state.save(list(self.caps.values()))
        except OSError as e:
            log.error("cannot write the power caps to %s: %s", self.state.path, e)
            return False
        return True


def _same(a: set[tuple[int, float]], b: set[tuple[int, float]]) -> bool:
    """The same processes: pids equal, create times within the tolerance."""
    if {p for p, _ in a} != {p for p, _ in b}:
        return False
    times = dict(b)
    return all(abs(t - times[p]) <= CREATE_TIME_TOLERANCE_S for p, t in a)
