"""`gpuevents import --from slurm`: jobs from `sacct` over a window written as imported job summaries."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import datetime

from gpuevents.config import Config
from gpuevents.costs import CostModel
from rules.history.sacct import FIELDS, parse, tally_of
from rules.usage.jobstore import JobStore

SACCT_TIMEOUT_S = 300.0


class SacctFailed(RuntimeError):
    """sacct could not be run, or said no; the message says what it said."""


@dataclass(frozen=True)
class SlurmOutcome:
    jobs: int  # allocations sacct listed
    gpu_jobs: int  # of them, jobs that held GPUs and ended
    running: int  # GPU jobs still running: the engine counts them live
    written: int  # summaries written (a job the engine saw live is left as it is)
    with_jobstats: int  # GPU jobs whose utilisation came from jobstats

    def lines(self, since: datetime, until: datetime) -> list[str]:
        out = [f"imported {self.written} of {self.gpu_jobs} GPU jobs (of {self.jobs} jobs) that ran from "
               f"{since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC; marked imported"]
        left = []
        if self.gpu_jobs > self.with_jobstats:
            left.append(f"{self.gpu_jobs - self.with_jobstats} jobs without jobstats data: allocations only, their "
                        "GPU utilisation unknown")
        if self.gpu_jobs > self.written:
            left.append(f"{self.gpu_jobs - self.written} jobs the engine recorded live (live wins)")
        if self.running:
            left.append(f"{self.running} GPU jobs still running (the engine counts them live)")
        if self.jobs > self.gpu_jobs + self.running:
            left.append(f"{self.jobs - self.gpu_jobs - self.running} jobs without GPUs or never started")
        if left:
            out.append("left out: " + "; ".join(left))
        return out


def sacct_command(binary: str, since: datetime, until: datetime) -> list[str]:
    return [binary, "--allusers", "--allocations", "--noheader", "--parsable2", "--duplicates",
            f"--starttime={since:%Y-%m-%dT%H:%M:%S}", f"--endtime={until:%Y-%m-%dT%H:%M:%S}",
            f"--format={','.join(FIELDS)}"]


def run_sacct(binary: str, since: datetime, until: datetime) -> str:
    """sacct's output for the window, its times in UTC (TZ=UTC: sacct prints local time without an offset)."""
    try:
        done = subprocess.run(sacct_command(binary, since, until), capture_output=True, text=True, check=False,
                              timeout=SACCT_TIMEOUT_S, env={**os.environ, "TZ": "UTC"})
    except FileNotFoundError:
        raise SacctFailed(f"{binary}: not found; install Slurm's client or pass --sacct PATH") from None
    except subprocess.TimeoutExpired:
        raise SacctFailed(f"{binary} did not answer in {SACCT_TIMEOUT_S:.0f}s; try a shorter window") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SacctFailed(f"{binary} exited {done.returncode}: {said[-1] if said else 'no message'}")
    return done.stdout


def import_slurm(config: Config, output: str) -> SlurmOutcome:
    """Write the ended GPU jobs in `output` (sacct's) to `engine.usage_db` as imported summaries."""
    jobs = parse(output)
    tallies = [t for t in (tally_of(j, config.cluster) for j in jobs) if t is not None]
    running = sum(1 for j in jobs if j.gpus > 0 and j.start is not None and j.end is None)
    with JobStore(config.engine.usage_db) as store:
        written = store.put_imported(tallies, CostModel(config.costs))
    return SlurmOutcome(jobs=len(jobs), gpu_jobs=len(tallies), running=running, written=written,
                        with_jobstats=sum(1 for t in tallies if t.util_known_s > 0))
