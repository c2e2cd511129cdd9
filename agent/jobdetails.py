"""Whose Slurm job it is and what it is: the prolog's details file (`.jobs/<id>` beside the HPC job mapping),
then one `squeue -j ID` for what the file lacks (QOS, time limit, name); cached per job id, never read per sample.

A value that is missing, unreadable or malformed stays None: nothing acts on a guess. Each failure is counted
(`failures`, exported as a metric) and logged once per job.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

_JOB_ID = re.compile(r"^\d{1,20}$")
_SAFE = re.compile(r"^[A-Za-z0-9._@+-]{1,128}$")
_FORMAT = "%i|%u|%a|%P|%q|%l|%S|%j"
"""squeue's fields, the free-text job name last: nothing before it can hold a `|`, so a name such as
`x UserId=root` cannot pass for another field (as it can in `scontrol show job -o`)."""
MAX_FILE_BYTES = 4096


@dataclass(frozen=True, slots=True)
class JobDetails:
    """What the scheduler says of a job; None where it did not say (or said something malformed)."""

    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    name: str | None = None
    started_at: datetime | None = None
    time_limit_s: float | None = None

    def merged(self, other: JobDetails) -> JobDetails:
        """These details, with the gaps filled from `other`."""
        return replace(self, **{f: getattr(other, f) for f in self.__slots__
                                if getattr(self, f) is None and getattr(other, f) is not None})

    @property
    def complete(self) -> bool:
        return all(getattr(self, f) is not None for f in ("user", "partition", "qos", "time_limit_s", "started_at"))


def _safe(value: str) -> str | None:
    value = value.strip()
    return value if _SAFE.match(value) and value not in ("(null)", "N/A") else None


def parse_details_file(text: str) -> JobDetails:
    """The prolog's `key=value` lines; unknown keys are ignored, malformed values are None."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            kv.setdefault(key.strip(), value)
    uid = kv.get("uid", "").strip()
    started = kv.get("started_at", "").strip()
    return JobDetails(
        user=_safe(kv.get("user", "")), uid=int(uid) if uid.isdigit() else None,
        account=_safe(kv.get("account", "")), partition=_safe(kv.get("partition", "")),
        name=_safe(kv.get("name", "")),
        started_at=datetime.fromtimestamp(int(started), UTC) if started.isdigit() and len(started) <= 12 else None,
    )


def parse_time_limit(text: str) -> float | None:
    """Slurm's `[days-]hours:minutes:seconds`, `minutes:seconds` or `minutes`, in seconds; None for
    UNLIMITED and anything else."""
    text = text.strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if m is None:
        return None
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # days-hours[:minutes[:seconds]]
        h, mi, s = ([*parts, 0, 0])[:3]
        return float(int(days) * 86400 + h * 3600 + mi * 60 + s)
    if len(parts) == 3:
        return float(parts[0] * 3600 + parts[1] * 60 + parts[2])
    if len(parts) == 2:
        return float(parts[0] * 60 + parts[1])
    return float(parts[0] * 60)


def parse_squeue_line(job_id: str, text: str) -> JobDetails:
    """One line of `squeue -h -j ID -o FORMAT` for this job; ValueError when it is not that."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ValueError(f"expected one line for job {job_id}, got {len(lines)}")
    fields = lines[0].split("|", 7)
    if len(fields) != 8 or fields[0].strip() != job_id:
        raise ValueError(f"not a line for job {job_id}: {lines[0][:80]!r}")
    _, user, account, partition, qos, limit, start, name = fields
    started: datetime | None = None
    try:
        started = datetime.fromisoformat(start.strip()).astimezone(UTC)  # squeue prints local time
    except ValueError:
        started = None
    return JobDetails(user=_safe(user), account=_safe(account), partition=_safe(partition), qos=_safe(qos),
                      name=name.strip()[:128] or None, started_at=started, time_limit_s=parse_time_limit(limit))


class JobDirectory:
    """Job id -> details, read once per job: the prolog's file on first sight, squeue once for the rest."""

    def __init__(self, directory: Path, squeue: Path | None = Path("squeue"), timeout_s: float = 5.0) -> None:
        self.details_dir = directory / ".jobs"
        self.squeue = squeue
        self.timeout_s = timeout_s
        self.known: dict[str, JobDetails] = {}
        self._asked: set[str] = set()
        self._failed: set[str] = set()
        self.failures = 0
        """Lookups that failed (squeue missing, slow, or answering garbage), counted every time."""

    def get(self, job_id: str) -> JobDetails | None:
        return self.known.get(job_id)

    def observe(self, job_ids: set[str]) -> None:
        """The jobs the mapping lists now: read each new one's details file; forget jobs that left."""
        for gone in [j for j in self.known if j not in job_ids]:
            del self.known[gone]
            self._asked.discard(gone)
            self._failed.discard(gone)
        for job in job_ids:
            if job not in self.known and _JOB_ID.match(job):
                self.known[job] = self._read_file(job)

    def _read_file(self, job: str) -> JobDetails:
        path = self.details_dir / job
        try:
            with path.open("rb") as f:
                raw = f.read(MAX_FILE_BYTES)
        except FileNotFoundError:
            return JobDetails()  # a prolog without details (dcgm-exporter's): squeue fills them
        except OSError as e:
            self._fail(job, f"cannot read {path} ({e.strerror})")
            return JobDetails()
        return parse_details_file(raw.decode("utf-8", errors="replace"))

    def wanting(self) -> list[str]:
        """Jobs whose details are incomplete and that squeue has not been asked about yet."""
        return [j for j, d in self.known.items() if not d.complete and j not in self._asked]

    async def lookup_missing(self) -> None:
        """Ask squeue once for each job that lacks details (one at a time: a slow slurmctld is not flooded)."""
        if self.squeue is None:
            return
        for job in self.wanting():
            self._asked.add(job)
            found = await self._squeue(job)
            if found is not None and job in self.known:
                self.known[job] = self.known[job].merged(found)

    async def _squeue(self, job: str) -> JobDetails | None:
        argv = [str(self.squeue), "-h", "-j", job, "-o", _FORMAT]
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
        except OSError as e:
            self._fail(job, f"{self.squeue} cannot be run ({e.strerror})")
            return None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            self._fail(job, f"{self.squeue} did not answer within {self.timeout_s:g}s")
            return None
        if proc.returncode != 0:
            self._fail(job, f"{self.squeue} failed ({proc.returncode}): {err.decode(errors='replace').strip()[:200]}")
            return None
        try:
            return parse_squeue_line(job, out.decode("utf-8", errors="replace"))
        except ValueError as e:
            self._fail(job, str(e))
            return None

    def _fail(self, job: str, why: str) -> None:
        self.failures += 1
        if job not in self._failed:
            self._failed.add(job)
            log.warning("details of Slurm job %s: %s; the job keeps what is known", job, why)
