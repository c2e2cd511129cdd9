"""The demand readers: Slurm's pending jobs (squeue) and Kubernetes' pending pods, read at a bounded rate by
the engine that holds the lease, published as `scheduler.demand` events for every engine to keep."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from gpuevents.aio import sleep_or_stop
from gpuevents.clock import Clock
from gpuevents.config import Config
from gpuevents.config.sched import DemandKubernetesConfig, DemandSlurmConfig
from gpuevents.demand import SQUEUE_PENDING_ARGS, kubernetes_pending, slurm_pending
from gpuevents.events import SCHEDULER_SOURCE, DemandReport, Event, make_event

log = logging.getLogger(__name__)

NOT_LEADING_POLL_S = 1.0
"""How often an engine that does not read demand (not the leader) looks whether it has become one."""
VALID_INTERVALS = 3
"""A report holds for this many reader intervals: a reader that stopped stops counting soon after."""


class DemandReader(Protocol):
    scheduler: str
    interval_s: float

    async def read(self) -> DemandReport | None: ...


class _Failures:
    """Failures counted every time, logged when the reason changes (not every interval)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.count = 0
        self._last = ""

    def fail(self, why: str) -> None:
        self.count += 1
        if why != self._last:
            self._last = why
            log.warning("%s: %s; demand from it is not reported until it answers", self.what, why)

    def ok(self) -> None:
        self._last = ""


class SlurmDemandReader:
    """`squeue -h -t PENDING -o …` every `interval`; its pending jobs' GPUs per partition and GPU type."""

    scheduler = "slurm"

    def __init__(self, cfg: DemandSlurmConfig) -> None:
        self.cfg = cfg
        self.interval_s = float(cfg.interval)
        self.failures = _Failures(f"demand from Slurm ({cfg.squeue})")
        self.bad_lines = 0

    async def read(self) -> DemandReport | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                str(self.cfg.squeue), *SQUEUE_PENDING_ARGS, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            self.failures.fail(f"cannot be run ({e.strerror})")
            return None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), float(self.cfg.timeout))
        except TimeoutError:
            proc.kill()
            await proc.wait()
            self.failures.fail(f"no answer within {float(self.cfg.timeout):g}s")
            return None
        if proc.returncode != 0:
            self.failures.fail(f"failed ({proc.returncode}): {err.decode(errors='replace').strip()[:200]}")
            return None
        entries, bad = slurm_pending(out.decode("utf-8", errors="replace"))
        if bad:
            self.bad_lines += bad
            self.failures.fail(f"{bad} line(s) not understood (left out)")
        else:
            self.failures.ok()
        return DemandReport(scheduler="slurm", entries=entries, valid_for_s=VALID_INTERVALS * self.interval_s)


class PodLister(Protocol):
    async def pending_pods(self) -> list[dict[str, Any]]: ...


class LightkubePods:
    """Pending pods through lightkube (`status.phase=Pending`, all namespaces), as API dicts."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def pending_pods(self) -> list[dict[str, Any]]:
        from lightkube.resources.core_v1 import Pod

        return [p.to_dict() async for p in self.client.list(Pod, namespace="*",
                                                              fields={"status.phase": "Pending"})]


class KubernetesDemandReader:
    """Pending pods asking for nvidia.com/gpu or a MIG slice, per node pool and GPU model."""

    scheduler = "kubernetes"

    def __init__(self, cfg: DemandKubernetesConfig, pods: PodLister, timeout_s: float = 15.0) -> None:
        self.interval_s = float(cfg.interval)
        self.pods = pods
        self.timeout_s = timeout_s
        self.failures = _Failures("demand from Kubernetes (pending pods)")

    async def read(self) -> DemandReport | None:
        try:
            pods = await asyncio.wait_for(self.pods.pending_pods(), self.timeout_s)
        except TimeoutError:
            self.failures.fail(f"no answer within {self.timeout_s:g}s")
            return None
        except Exception as e:  # an API error, a connection refused: the next interval tries again
            self.failures.fail(f"{type(e).__name__}: {e}")
            return None
        self.failures.ok()
        return DemandReport(scheduler="kubernetes", entries=kubernetes_pending(pods),
                            valid_for_s=VALID_INTERVALS * self.interval_s)


def readers_from_config(config: Config) -> list[DemandReader]:
    out: list[DemandReader] = []
    if config.demand.slurm.enabled:
        out.append(SlurmDemandReader(config.demand.slurm))
    if config.demand.kubernetes.enabled:
        from gpuevents.kube import make_client

        out.append(KubernetesDemandReader(config.demand.kubernetes,
                                          LightkubePods(make_client(config.actions.kubernetes))))
    return out


async def run_reader(reader: DemandReader, publish: Callable[[Event], None], cluster: str, clock: Clock,
                     stop: asyncio.Event, active: Callable[[], bool]) -> None:
    """Read every interval while `active()` (this engine holds the lease), publish each report."""
    while not stop.is_set():
        if not active():
            await sleep_or_stop(stop, NOT_LEADING_POLL_S)
            continue
        report = await reader.read()
        if report is not None:
            publish(make_event("scheduler.demand", SCHEDULER_SOURCE, report, cluster=cluster, time=clock.now()))
        await sleep_or_stop(stop, reader.interval_s)
