"""Slurm's accounting as job summaries: `sacct --parsable2` lines (user, account, partition, GPUs from AllocTRES,
start, end, state) and, where the site runs Princeton's jobstats, the GPU summary its epilog stores in
AdminComment (`JS1:` and base64 of gzipped JSON). Pure."""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import re
import zlib
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rules.usage.fits import bin_of, mem_bin_of
from rules.usage.jobledger import JobTally

FIELDS = ("JobID", "JobName", "User", "Account", "Partition", "QOS", "AllocTRES", "Start", "End", "State",
          "NodeList", "AdminComment")
"""What `sacct --format` is asked for, in this order."""
_GPUS = re.compile(r"(?:^|,)gres/gpu=(\d+)")
_TYPED_GPUS = re.compile(r"(?:^|,)gres/gpu:[^=,]+=(\d+)")
_HOSTS = re.compile(r"([^,\[]+)(?:\[([^\]]+)\])?")


@dataclass(frozen=True, slots=True)
class SacctJob:
    id: str
    name: str
    user: str
    account: str
    partition: str
    qos: str
    gpus: int
    start: datetime | None
    end: datetime | None
    state: str
    nodes: list[str]
    jobstats: dict[str, Any] | None
    """The jobstats summary, where its epilog stored one."""


class SacctError(ValueError):
    """A line that is not what `sacct --parsable2 --format=<FIELDS>` prints; says which line."""


def gpus_of(tres: str) -> int:
    """GPUs in an AllocTRES (`cpu=8,gres/gpu:a100=2,gres/gpu=2,mem=64G,node=1`): `gres/gpu=`, else the typed ones."""
    m = _GPUS.search(tres)
    if m:
        return int(m.group(1))
    return sum(int(n) for n in _TYPED_GPUS.findall(tres))


def hosts(nodelist: str) -> list[str]:
    """`gpu[01-03,07],login1` → gpu01, gpu02, gpu03, gpu07, login1 (the forms sacct prints)."""
    if nodelist in ("", "None assigned", "(null)"):
        return []
    out = []
    for m in _HOSTS.finditer(nodelist):
        prefix, ranges = m.group(1).lstrip(","), m.group(2)
        if not prefix:
            continue
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            a, _, b = part.partition("-")
            if not b:
                out.append(prefix + a)
                continue
            out += [f"{prefix}{i:0{len(a)}d}" for i in range(int(a), int(b) + 1)]
    return out


def _time(text: str) -> datetime | None:
    if text in ("", "Unknown", "None"):
        return None
    return datetime.fromisoformat(text).replace(tzinfo=UTC)  # sacct is run with TZ=UTC


def jobstats_of(comment: str) -> dict[str, Any] | None:
    """The jobstats summary in an AdminComment, or None (no summary, `Short` or `None` jobs, another comment)."""
    if not comment.startswith("JS1:H4s"):
        return None
    try:
        data = json.loads(gzip.decompress(base64.b64decode(comment[4:])))
    except (binascii.Error, OSError, EOFError, zlib.error, ValueError):
        return None
    return data if isinstance(data, dict) else None


def parse(text: str) -> list[SacctJob]:
    """Each job allocation of `sacct --parsable2 --noheader --format=<FIELDS>` output; GPU jobs and others."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) < len(FIELDS):
            raise SacctError(f"sacct output line {n}: {len(parts)} fields, expected {len(FIELDS)} "
                             f"({', '.join(FIELDS)})")
        last = len(FIELDS) - 1  # a comment may hold a `|` of its own
        f = dict(zip(FIELDS, [*parts[:last], "|".join(parts[last:])], strict=True))
        try:
            start, end = _time(f["Start"]), _time(f["End"])
        except ValueError:
            raise SacctError(f"sacct output line {n}: start {f['Start']!r} or end {f['End']!r} is not a time") from None
        out.append(SacctJob(id=f["JobID"], name=f["JobName"], user=f["User"], account=f["Account"],
                            partition=f["Partition"], qos=f["QOS"], gpus=gpus_of(f["AllocTRES"]), start=start, end=end,
                            state=f["State"].split(" ")[0], nodes=hosts(f["NodeList"]),
                            jobstats=jobstats_of(f["AdminComment"])))
    return out


def tally_of(job: SacctJob, cluster: str) -> JobTally | None:
    """The summary tally of a GPU job that ended (None for the rest: a running job is the engine's to count): its
    GPU-seconds from the allocation; its utilisation and memory from jobstats where present, else unknown."""
    if job.gpus <= 0 or job.start is None or job.end is None:
        return None
    end = job.end
    seconds = max(0.0, (end - job.start).total_seconds())
    t = JobTally(cluster=cluster, scheduler="slurm", id=job.id, first_seen=job.start, last_seen=end,
                 user=job.user or None, name=job.name or None, account=job.account or None,
                 partition=job.partition or None, qos=job.qos or None, nodes=list(job.nodes), gpu_count=job.gpus,
                 started_at=job.start, ended_at=job.end, gpu_s=seconds * job.gpus, imported=True)
    if job.jobstats is not None:
        _add_jobstats(t, job.jobstats, seconds)
    return t


def _add_jobstats(t: JobTally, stats: dict[str, Any], seconds: float) -> None:
    """jobstats keeps each GPU's mean utilisation and peak memory (bytes) per node: each GPU's mean over the job's
    time, its peak as a bin of that time (the spread inside a GPU is not kept)."""
    for node in (stats.get("nodes") or {}).values():
        utils = node.get("gpu_utilization") or {}
        used = node.get("gpu_used_memory") or {}
        for gpu, util in utils.items():
            u = float(util)
            t.util_s += u * seconds
            t.util_known_s += seconds
            t.util_hist[bin_of(u)] = t.util_hist.get(bin_of(u), 0.0) + seconds
            t.util_peak = max(t.util_peak or 0.0, u)
            if gpu in used:
                mib = float(used[gpu]) / 2**20
                t.mem_peak_mib = max(t.mem_peak_mib or 0.0, mib)
                t.mem_hist[mem_bin_of(mib)] = t.mem_hist.get(mem_bin_of(mib), 0.0) + seconds
