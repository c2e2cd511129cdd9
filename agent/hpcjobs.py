"""dcgm-exporter's HPC job mapping: a directory with a file per GPU (`0`, or `2.1` for a MIG instance) that
lists the jobs on that GPU, one per line, written by the scheduler's prolog and epilog."""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

_GPU_FILE = re.compile(r"^\d+(\.\d+)?$")


class JobMapping:
    """Reads the directory on every call (a scrape): a few small files, always current."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._warned: set[str] = set()

    def jobs(self) -> dict[str, list[str]]:
        """GPU key (`3`, `3.1`) -> its jobs, in file order; empty when the directory cannot be read."""
        try:
            entries = [p for p in self.directory.iterdir() if _GPU_FILE.match(p.name) and p.is_file()]
        except OSError as e:
            self._warn_once("dir", f"HPC job mapping directory {self.directory} cannot be read ({e.strerror}); "
                            "no hpc_job labels until it can")
            return {}
        out: dict[str, list[str]] = {}
        for p in entries:
            try:
                lines = p.read_text().splitlines()
            except OSError as e:  # removed by an epilog between listing and reading: no jobs on it
                log.debug("HPC job mapping file %s: %s", p, e)
                continue
            jobs = [line.strip() for line in lines if line.strip()]
            if jobs:
                out[p.name] = jobs
        return out

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s", message)
