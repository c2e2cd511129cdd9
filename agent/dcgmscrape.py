"""MIG instances' activity from a dcgm-exporter on the node (`agent.dcgm.url`), for GPUs without GPM.

NVML gives an A100's or A30's MIG instance no utilization, and GPM (which gives a Hopper's) is not there; DCGM's
profiling is, per GPU instance. dcgm-exporter serves it as `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (a ratio) labelled with
the parent GPU's `UUID` and `gpu` index and the instance's `GPU_I_ID`. The agent reads that page every `interval`
(in its sampling thread, bounded by `timeout`) and puts the ratio, as a percentage, in the instance's
`util_pct` and `gr_engine_active_pct` (`DCGM_FI_PROF_SM_ACTIVE` in `sm_active_pct`), as GPM would: the idle
rule then decides on it. A value older than `max_age` is no signal; a reading that has its own is left alone.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from prometheus_client.parser import text_string_to_metric_families

from agent.sample import GpuReading, NodeReading
from gpuevents.config.gpu import AgentDcgmConfig

log = logging.getLogger(__name__)

#: dcgm-exporter series -> the reading's field it fills (the ratio as a percentage)
FIELDS = {"DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active_pct", "DCGM_FI_PROF_SM_ACTIVE": "sm_active_pct"}
MAX_BYTES = 8 * 1024 * 1024  # a node's page is tens of KiB; more is not a dcgm-exporter

#: (parent GPU uuid or `#<gpu index>`, GPU instance id) -> field -> percentage
Values = dict[tuple[str, int], dict[str, float]]
Fetch = Callable[[str, float], str]


def fetch_url(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read(MAX_BYTES)).decode("utf-8", "replace")


def parse(text: str) -> Values:
    """The per-instance values of a dcgm-exporter page; series without `GPU_I_ID` (whole GPUs) are left out."""
    out: Values = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            field = FIELDS.get(s.name)
            gi = s.labels.get("GPU_I_ID", "")
            if field is None or not gi.isdigit() or s.value != s.value:  # NaN: not measured
                continue
            pct = round(max(0.0, min(1.0, float(s.value))) * 100.0, 3)
            for key in (s.labels.get("UUID"), f"#{s.labels['gpu']}" if s.labels.get("gpu") else None):
                if key:
                    out.setdefault((key, int(gi)), {})[field] = pct
    return out


class DcgmActivity:
    """Reads the page at most every `interval` and fills MIG instances' activity into a node's reading."""

    def __init__(self, config: AgentDcgmConfig, fetch: Fetch = fetch_url) -> None:
        if config.url is None:
            raise ValueError("agent.dcgm.url is not set")
        self.url = config.url
        self.config = config
        self.fetch = fetch
        self.values: Values = {}
        self.read_at: float | None = None  # when `values` were read
        self.tried_at: float | None = None
        self.failing = False

    def current(self, t: float) -> Values:
        """The values as of `t` (epoch seconds): read again when `interval` has passed; {} once too old."""
        if self.tried_at is None or t - self.tried_at >= self.config.interval:
            self.tried_at = t
            try:
                self.values, self.read_at = parse(self.fetch(self.url, self.config.timeout)), t
                if self.failing:
                    log.info("dcgm-exporter at %s answers again", self.url)
                self.failing = False
            except (OSError, ValueError) as e:  # refused, timed out, HTTP error, not its text format
                if not self.failing:
                    log.warning("cannot read dcgm-exporter at %s (%s): MIG instances without GPM have no activity "
                                "signal until it answers", self.url, e)
                self.failing = True
        if self.read_at is None or t - self.read_at > self.config.max_age:
            return {}
        return self.values

    def fill(self, reading: NodeReading, now: datetime) -> NodeReading:
        """The reading with each MIG instance that has no activity signal of its own given dcgm-exporter's."""
        if not any(g.mig_parent is not None and g.util_pct is None for g in reading.gpus):
            return reading
        values = self.current(now.timestamp())
        if not values:
            return reading
        index = {g.uuid: g.index for g in reading.gpus if g.mig_parent is None}
        gpus = tuple(self._filled(g, values, index) for g in reading.gpus)
        return replace(reading, gpus=gpus)

    @staticmethod
    def _filled(g: GpuReading, values: Values, index: dict[str, int]) -> GpuReading:
        if g.mig_parent is None or g.mig_gi_id is None or g.util_pct is not None or g.lost:
            return g
        got = values.get((g.mig_parent, g.mig_gi_id))
        if got is None and g.mig_parent in index:
            got = values.get((f"#{index[g.mig_parent]}", g.mig_gi_id))
        if not got or "gr_engine_active_pct" not in got:
            return g
        return replace(g, util_pct=got["gr_engine_active_pct"], gr_engine_active_pct=got["gr_engine_active_pct"],
                       sm_active_pct=got.get("sm_active_pct", g.sm_active_pct))
