"""The simulated sampler: N nodes × G GPUs running a scenario's job mix, deterministic for a seed.

Simulated processes have pids, users and create times but are not OS processes; killing one ends it
in the simulation (a `ghost` ignores TERM and needs KILL).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from agent.sample import GpuReading, LiveProcess, NodeReading, PowerLimitError, ProcessIdentity, ProcReading
from agent.scenario import JobMix, PinnedJob, Scenario, profile_mem_mib
from agent.simreadings import ACTIVITY_BY_KIND, Load, MigInstance, combined, instance, physical

_M64 = (1 << 64) - 1
_PID_BASE = 2000
_PID_SPACE = 4_000_000
_MAX_CATCHUP = 10_000


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a fast, well-spread integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def noise(*parts: int) -> float:
    """A deterministic number in [0, 1) for the given integers."""
    h = 0
    for p in parts:
        h = _mix64(h ^ (p & _M64))
    return h / float(1 << 64)


def _hex(*parts: object, n: int = 64) -> str:
    return hashlib.sha256(":".join(map(str, parts)).encode()).hexdigest()[:n]


@dataclass
class SimJob:
    """One job on one GPU: its processes share the GPU's memory and utilization."""

    seq: int
    gpu: int
    kind: str
    start: float  # epoch seconds, real time
    end: float  # math.inf: until killed
    user: str
    command: str
    util: tuple[float, float]
    mem_mib: float
    pids: tuple[int, ...]
    blip_every: float | None = None
    ignores_term: bool = False
    activity: tuple[float, float, float] = (0.0, 0.0, 0.0)  # SM, tensor, DRAM as shares of utilization
    killed: set[int] = field(default_factory=set)
    idents: dict[int, ProcessIdentity] = field(default_factory=dict)

    def running(self, t: float) -> bool:
        return self.start <= t < self.end and len(self.killed) < len(self.pids)


class SimulatedNode:
    """One simulated node: a sampler (and a process control for the kill command)."""

    kind = "simulated"
    blocking = False

    def __init__(self, scenario: Scenario, *, node: str, node_index: int = 0, gpus: int = 8,
                 seed: int = 1, start: datetime, speedup: float = 1.0) -> None:
        self.scenario = scenario
        self.node = node
        self.node_index = node_index
        self.gpu_count = gpus
        self.seed = seed
        self.t0 = start.timestamp()
        self.scale = 1.0 / (scenario.speedup * speedup)  # real seconds per simulated second
        self.driver_version: str | None = "550.54.15 (simulated)"
        self._uuids = [f"GPU-{_hex(seed, node, g, n=8)}-{_hex(seed, node, g, 'u', n=4)}-"
                       f"{_hex(node, g, n=4)}-{_hex(g, node, n=4)}-{_hex(seed, g, n=12)}"
                       for g in range(gpus)]
        self.instances = self._mig_instances()
        self._mig_parents = {i.parent for i in self.instances}
        #: where jobs run: the GPUs without MIG, then the MIG instances
        self.slots = [g for g in range(gpus) if g not in self._mig_parents] + [i.index for i in self.instances]
        total = gpus + len(self.instances)
        self._rngs = [random.Random(_mix64(seed * 1_000_003 + node_index * 65_537 + g)) for g in range(total)]
        self._seq = [0] * total
        self._jobs: list[SimJob | None] = [None] * total
        self._next_start = [self.t0] * total
        self._now = self.t0
        self._energy_mj = [noise(seed, node_index, g, 0xE) * 4e11 for g in range(gpus)]  # since boot
        self.power_limits: dict[int, float] = {}  # limits a power_cap set (W); absent: the model's own
        self._pinned: dict[int, list[PinnedJob]] = {}
        for p in scenario.pinned:
            if p.gpu in self.slots and (p.node is None or p.node == node_index):
                self._pinned.setdefault(p.gpu, []).append(p)
        for g in self.slots:
            if g in self._pinned:
                self._pinned[g].sort(key=lambda p: p.start)
                self._next_start[g] = math.inf
            else:
                self._open_gpu(g)

    def _mig_instances(self) -> list[MigInstance]:
        mig = self.scenario.gpu.mig
        out: list[MigInstance] = []
        if mig is None:
            return out
        for g in sorted({g for g in mig.gpus if g < self.gpu_count}):
            for k, profile in enumerate(mig.profiles):
                idx = self.gpu_count + len(out)
                uuid = (f"MIG-{_hex(self.seed, self.node, idx, n=8)}-{_hex(idx, n=4)}-{_hex(g, k, n=4)}-"
                        f"{_hex(self.node, k, n=4)}-{_hex(self.seed, idx, n=12)}")
                out.append(MigInstance(index=idx, parent=g, profile=profile, gi_id=k + 1, uuid=uuid,
                                       mem_total_mib=profile_mem_mib(profile)))
        return out

    def mem_total_mib(self, slot: int) -> float:
        if slot < self.gpu_count:
            return self.scenario.gpu.mem_total_mib
        return self.instances[slot - self.gpu_count].mem_total_mib

    # ------------------------------------------------------------ timeline
    def _open_gpu(self, g: int) -> None:
        rng = self._rngs[g]
        if self.scenario.jobs and rng.random() < self.scenario.busy_at_start:
            job = self._new_job(g, self.t0)
            # already running for a while when the agent starts: a random share of its length
            ran = (job.end - job.start) * rng.random() if math.isfinite(job.end) else 0.0
            job.start -= ran
            job.end -= ran
            self._stamp(job)
            self._jobs[g] = job
        else:
            self._next_start[g] = self.t0 + self._gap(rng)

    def _gap(self, rng: random.Random) -> float:
        lo, hi = self.scenario.gap
        return rng.uniform(lo, hi) * self.scale

    def _pick(self, rng: random.Random) -> JobMix:
        jobs = self.scenario.jobs
        return rng.choices(jobs, weights=[j.weight for j in jobs])[0]

    def _new_job(self, g: int, start: float) -> SimJob:
        rng = self._rngs[g]
        mix = self._pick(rng)
        lo, hi = mix.duration
        length = rng.uniform(lo, hi) * self.scale
        n = max(1, round(rng.uniform(*mix.processes)))
        users = mix.users or self.scenario.users
        mem = rng.uniform(*mix.mem_pct) / 100.0 * self.mem_total_mib(g)
        job = self._job(g, mix.kind, start, start + length, rng.choice(users),
                        rng.choice(mix.commands), mix.util_pct, mem, n, mix.blip_every, mix.ignores_term)
        job.activity = _activity(mix)
        return job

    def _job(self, g: int, kind: str, start: float, end: float, user: str, command: str,
             util: tuple[float, float], mem_mib: float, n: int, blip_every: float | None,
             ignores_term: bool) -> SimJob:
        seq = self._seq[g]
        self._seq[g] += 1
        pids = tuple(_PID_BASE + (g * 60_000 + seq * 8 + k) % _PID_SPACE for k in range(n))
        job = SimJob(seq=seq, gpu=g, kind=kind, start=start, end=end, user=user, command=command,
                     util=util, mem_mib=round(mem_mib, 1), pids=pids,
                     blip_every=blip_every * self.scale if blip_every else None,
                     ignores_term=ignores_term or kind == "ghost")
        self._stamp(job)
        return job

    def _pinned_job(self, g: int, p: PinnedJob) -> SimJob:
        mix = self.scenario.mix(p.kind)
        start = self.t0 + p.start * self.scale
        end = start + p.duration * self.scale if p.duration is not None else math.inf
        util = p.util_pct or (mix.util_pct if mix else (0.0, 0.0))
        mem_pct = p.mem_pct or (mix.mem_pct if mix else (30.0, 30.0))
        mem = (mem_pct[0] + mem_pct[1]) / 2 / 100.0 * self.mem_total_mib(g)
        command = p.command or (mix.commands[0] if mix else "python notebook.py")
        job = self._job(g, p.kind, start, end, p.user or self.scenario.users[0], command, util, mem,
                        p.processes, mix.blip_every if mix else None, mix.ignores_term if mix else False)
        job.activity = _activity(mix) if mix else ACTIVITY_BY_KIND[p.kind]
        job.start -= p.age * self.scale  # create time in the past; still seen only from `start`
        self._stamp(job)
        job.start = start
        return job

    def _stamp(self, job: SimJob) -> None:
        """Identities (fixed at creation): create time, name, container and pod."""
        s = self.scenario
        name = job.command.split()[0].rsplit("/", 1)[-1] if job.command else "python"
        job.idents = {}
        for k, pid in enumerate(job.pids):
            ct = datetime.fromtimestamp(job.start + 0.25 * k, UTC)
            container = pod_uid = pod = container_name = None
            labels: dict[str, str] = {}
            if s.kubernetes:
                container_name = job.kind.replace("_", "-")
                container = _hex(self.seed, self.node, job.gpu, job.seq, k)
                u = _hex(self.seed, self.node, job.gpu, job.seq, "pod", n=32)
                pod_uid = f"{u[:8]}-{u[8:12]}-{u[12:16]}-{u[16:20]}-{u[20:32]}"
                pod = f"{s.namespace}/{job.user}-{job.kind.replace('_', '-')}-{job.gpu}-{job.seq}"
                labels = {"app": job.kind.replace("_", "-"), "user": job.user}
            job.idents[pid] = ProcessIdentity(
                pid=pid, create_time=ct, name=name, exe=f"/usr/bin/{name}", cmdline=job.command, user=job.user,
                uid=1000 + sum(map(ord, job.user)) % 1000, ppid=1, container_id=container,
                pod_uid=pod_uid, pod=pod, labels=labels, container=container_name,
                job=str(100_000 + self.node_index * 10_000 + job.gpu * 100 + job.seq) if s.slurm else None,
            )

    def _advance(self, g: int, t: float) -> SimJob | None:
        """The job running on GPU g at t, generating the timeline up to t."""
        pinned = self._pinned.get(g)
        if pinned is not None:
            return self._advance_pinned(g, t, pinned)
        rng = self._rngs[g]
        for _ in range(_MAX_CATCHUP):
            job = self._jobs[g]
            if job is not None:
                if job.running(t) or t < job.start:
                    return job if job.running(t) else None
                # ended (its time is up, or every process was killed): a gap, then the next job
                ended_at = min(job.end, self._now) if len(job.killed) == len(job.pids) else job.end
                self._jobs[g] = None
                self._next_start[g] = ended_at + self._gap(rng)
                continue
            if t < self._next_start[g] or not self.scenario.jobs:
                return None
            self._jobs[g] = self._new_job(g, self._next_start[g])
        return None

    def _advance_pinned(self, g: int, t: float, pinned: list[PinnedJob]) -> SimJob | None:
        job = self._jobs[g]
        if job is not None and (job.running(t) or t < job.start):
            return job if job.running(t) else None
        while pinned:
            p = pinned[0]
            if t < self.t0 + p.start * self.scale:
                return None
            pinned.pop(0)
            job = self._pinned_job(g, p)
            self._jobs[g] = job
            if job.running(t):
                return job
        return None

    # ------------------------------------------------------------ sampling
    def sample(self, now: datetime) -> NodeReading:
        t = now.timestamp()
        prev, self._now = self._now, t
        sec = int((t - self.t0) / self.scale) if self.scale else 0
        gm = self.scenario.gpu
        procs: list[ProcReading] = []
        loads: dict[int, Load] = {}
        for g in self.slots:
            job = self._advance(g, t)
            if job is None:
                loads[g] = Load()
                continue
            lo, hi = job.util
            util = lo + (hi - lo) * noise(self.seed, self.node_index, g, sec)
            if job.blip_every and prev >= job.start and (
                (t - job.start) // job.blip_every > (prev - job.start) // job.blip_every
            ):
                util = 60.0 + 30.0 * noise(self.seed, self.node_index, g, sec)  # one busy sample
            live = [p for p in job.pids if p not in job.killed]
            mem = job.mem_mib * len(live) / len(job.pids)
            for pid in live:
                procs.append(ProcReading(pid=pid, gpu=g, mem_mib=round(mem / len(live), 1),
                                         sm_util_pct=round(util / len(live), 1)))
            loads[g] = Load.of(util, mem, job.activity)
        gpus: list[GpuReading] = []
        dt = max(0.0, t - prev)
        for g in range(self.gpu_count):
            mine = [(i, loads[i.index]) for i in self.instances if i.parent == g]
            load = combined(mine) if g in self._mig_parents else loads[g]
            n = noise(self.seed, self.node_index, g, sec)
            r = physical(gm, g, self._uuids[g], load, n, 0, self.node_index, mig_enabled=g in self._mig_parents)
            cap = self.power_limits.get(g)
            if cap is not None:  # a power_cap: the GPU draws no more than its limit
                r = replace(r, power_limit_w=cap, power_w=min(r.power_w or 0.0, cap))
            self._energy_mj[g] += (r.power_w or 0.0) * dt * 1000.0  # power over the sampling clock
            gpus.append(replace(r, energy_mj=int(self._energy_mj[g])))
        for inst in self.instances:
            gpus.append(instance(gm, inst, self._uuids[inst.parent], loads[inst.index], self.node_index))
        return NodeReading(gpus=tuple(gpus), procs=tuple(procs))

    # ------------------------------------------------------------ power limits (PowerControl)
    def _whole(self, index: int) -> None:
        if not 0 <= index < self.gpu_count or index in self._mig_parents:
            raise PowerLimitError(f"no GPU {index} whose power limit can be set")

    def power_bounds(self, index: int) -> tuple[float, float]:
        """As an H100's: down to 30 % of its rated limit."""
        self._whole(index)
        rated = self.scenario.gpu.power_limit_w
        return round(rated * 0.3, 1), rated

    def power_limit(self, index: int) -> float:
        self._whole(index)
        return self.power_limits.get(index, self.scenario.gpu.power_limit_w)

    def set_power_limit(self, index: int, watts: float) -> None:
        low, high = self.power_bounds(index)
        if not low <= watts <= high:
            raise PowerLimitError(f"{watts:g} W is outside {low:g}-{high:g} W")
        if watts == high:
            self.power_limits.pop(index, None)
        else:
            self.power_limits[index] = watts

    def _running(self) -> dict[int, SimJob]:
        out: dict[int, SimJob] = {}
        for job in self._jobs:
            if job is not None and job.running(self._now):
                for pid in job.pids:
                    if pid not in job.killed:
                        out[pid] = job
        return out

    def identify(self, pids: Iterable[int]) -> dict[int, ProcessIdentity]:
        running = self._running()
        return {pid: running[pid].idents[pid] for pid in pids if pid in running}

    def close(self) -> None:
        return None

    # ------------------------------------------------------------ process control
    def lookup(self, pid: int) -> LiveProcess | None:
        job = self._running().get(pid)
        if job is None:
            return None
        ident = job.idents[pid]
        return LiveProcess(pid=pid, create_time=ident.create_time, user=ident.user, name=ident.name, exe=ident.exe)

    def send(self, pid: int, create_time: datetime, signal_name: str) -> bool:
        job = self._running().get(pid)
        if job is None or abs((job.idents[pid].create_time - create_time).total_seconds()) > 1.0:
            return False
        if signal_name == "KILL" or (signal_name in ("TERM", "INT", "QUIT") and not job.ignores_term):
            job.killed.add(pid)
        return True

    def alive(self, pid: int, create_time: datetime) -> bool:
        job = self._running().get(pid)
        return job is not None and abs((job.idents[pid].create_time - create_time).total_seconds()) <= 1.0


def _activity(mix: JobMix) -> tuple[float, float, float]:
    sm, tensor, dram = ACTIVITY_BY_KIND[mix.kind]
    return (sm if mix.sm_ratio is None else mix.sm_ratio, tensor if mix.tensor_ratio is None else mix.tensor_ratio,
            dram)


def fleet(scenario: Scenario, *, nodes: int, gpus_per_node: int, seed: int, start: datetime,
          speedup: float = 1.0, prefix: str = "sim-") -> list[SimulatedNode]:
    """`nodes` simulated nodes named `sim-000`, `sim-001`, ... each with its own random stream."""
    width = max(3, len(str(nodes - 1)))
    return [SimulatedNode(scenario, node=f"{prefix}{i:0{width}d}", node_index=i, gpus=gpus_per_node,
                          seed=seed, start=start, speedup=speedup) for i in range(nodes)]
