"""Generated dcgm-exporter history for import tests: GPUs (whole ones, and MIG instances with their profiles) that
go through every state — busy, held idle by a pod, held idle by memory in use with no pod, unallocated — with
Kubernetes labels while a pod holds them; written as OpenMetrics for `promtool tsdb create-blocks-from
openmetrics`, with the truth (GPU-hours per state) it was generated from.

A series that ends gets a NaN sample at the next step: live scraping writes a staleness marker there, which
backfilling cannot, and without it Prometheus would return the ended series for five more minutes.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

STATES = ("busy", "pod_idle", "mem_idle", "free")
TEAM_OF = {"nlp": "language", "vision": "vision"}  # a pod's `team` label, by its namespace
OWNERS = ("alice", "bob", "carol")


@dataclass(frozen=True)
class Gpu:
    node: str
    gpu: int
    uuid: str
    model: str
    profile: str = ""
    gi: int = 0
    share: float = 1.0  # of a physical GPU

    @property
    def index(self) -> int:
        """The index gpuevents gives it: a MIG instance's is 100 × (its GPU + 1) + its instance id."""
        return 100 * (self.gpu + 1) + self.gi if self.profile else self.gpu

    def labels(self) -> dict[str, str]:
        out = {"gpu": str(self.gpu), "UUID": self.uuid, "pci_bus_id": f"00000000:{self.gpu + 1:02d}:00.0",
               "device": f"nvidia{self.gpu}", "modelName": self.model, "Hostname": self.node}
        if self.profile:
            out |= {"GPU_I_PROFILE": self.profile, "GPU_I_ID": str(self.gi)}
        return out


H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
FLEET = (
    Gpu("dgx-a", 0, "GPU-a0", H100), Gpu("dgx-a", 1, "GPU-a1", H100), Gpu("dgx-a", 2, "GPU-a2", H100),
    Gpu("dgx-b", 0, "GPU-b0", A100, "3g.40gb", 1, 3 / 7), Gpu("dgx-b", 0, "GPU-b0", A100, "2g.20gb", 5, 2 / 7),
    Gpu("dgx-b", 0, "GPU-b0", A100, "2g.20gb", 6, 2 / 7), Gpu("dgx-b", 1, "GPU-b1", A100),
)
PHYSICAL_GPUS = 5


@dataclass(frozen=True)
class Segment:
    start: int
    end: int
    state: str
    pod: str = ""
    namespace: str = ""
    owner: str = ""


def timeline(g: Gpu, start: int, end: int, seed: int) -> list[Segment]:
    rng = random.Random(f"{seed}/{g.node}/{g.gpu}/{g.gi}")
    out, t, n = [], start, 0
    while t < end:
        length = rng.randrange(1, 9) * 1800 + rng.randrange(0, 1800, 120)
        state = rng.choice(STATES)
        pod = ""
        if state == "pod_idle" or (state == "busy" and rng.random() < 0.7):
            n += 1
            pod = f"train-{g.node}-{g.gpu}-{g.gi}-{n}"
        ns = rng.choice(("nlp", "vision")) if pod else ""
        out.append(Segment(t, min(end, t + length), state, pod, ns, rng.choice(OWNERS) if pod else ""))
        t += length
    return out


def truth(segments: dict[Gpu, list[Segment]], since: int, until: int) -> dict[str, float]:
    """GPU-hours per state over [since, until), each GPU weighted by its share of a physical GPU."""
    hours: dict[str, float] = defaultdict(float)
    for g, segs in segments.items():
        for s in segs:
            seconds = max(0, min(s.end, until) - max(s.start, since))
            key = {"busy": "busy_h", "free": "unallocated_h"}.get(s.state, "held_idle_h")
            hours[key] += seconds * g.share / 3600
    hours["gpu_h"] = hours["busy_h"] + hours["held_idle_h"] + hours["unallocated_h"]
    return dict(hours)


def _values(g: Gpu, s: Segment, rng: random.Random) -> dict[str, float]:
    total = 81920.0 * g.share if g.profile else 81920.0
    util = rng.uniform(40, 98) if s.state == "busy" else (rng.uniform(0, 2) if s.state != "free" else 0.0)
    used = {"busy": 0.6, "pod_idle": 0.2, "mem_idle": 0.25, "free": 0.0}[s.state] * total
    out = {"DCGM_FI_DEV_FB_USED": round(used), "DCGM_FI_DEV_FB_FREE": round(total - used),
           "DCGM_FI_DEV_POWER_USAGE": round(70 + 3.5 * util, 1)}
    if g.profile:  # a MIG instance has no GPU_UTIL: its graphics engine activity, a ratio
        out["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] = round(util / 100, 4)
    else:
        out["DCGM_FI_DEV_GPU_UTIL"] = round(util)
    return out


def openmetrics(segments: dict[Gpu, list[Segment]], step: int) -> str:
    """Every GPU's samples every `step` seconds, as dcgm-exporter labels them, in OpenMetrics text."""
    families: dict[str, dict[tuple[tuple[str, str], ...], list[tuple[int, float]]]] = defaultdict(dict)
    for g, segs in segments.items():
        rng = random.Random(f"values/{g.uuid}/{g.gi}")
        for s in segs:
            labels = g.labels() | ({"pod": s.pod, "namespace": s.namespace, "container": "main"} if s.pod else {})
            key = tuple(sorted(labels.items()))
            first = s.start + (-s.start % step)
            for t in range(first, s.end, step):
                for metric, v in _values(g, s, rng).items():
                    families[metric].setdefault(key, []).append((t, v))
            end_mark = s.end + (-s.end % step)
            for metric in _values(g, s, rng):
                families[metric].setdefault(key, []).append((end_mark, float("nan")))
            if s.pod:  # what kube-state-metrics says of the pod while it runs
                pod = (("label_owner", s.owner), ("label_team", TEAM_OF[s.namespace]), ("namespace", s.namespace),
                       ("pod", s.pod), ("uid", f"uid-{s.pod}"))
                families["kube_pod_labels"][pod] = [(t, 1.0) for t in range(first, s.end, step)]
    lines = []
    for metric, series in sorted(families.items()):
        lines.append(f"# TYPE {metric} gauge")
        for key, samples in series.items():
            text = ",".join(f'{k}="{v}"' for k, v in key)
            merged: dict[int, float] = {}
            for t, v in samples:  # a series that comes back at the step its NaN was for: the value wins
                if t not in merged or merged[t] != merged[t]:
                    merged[t] = v
            lines += [f"{metric}{{{text}}} {'NaN' if v != v else v} {t}" for t, v in sorted(merged.items())]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


def generate(since: int, until: int, step: int, seed: int = 7) -> tuple[dict[Gpu, list[Segment]], str]:
    segments = {g: timeline(g, since, until, seed) for g in FLEET}
    return segments, openmetrics(segments, step)


def write(path: Path, since: int, until: int, step: int, seed: int = 7) -> dict[Gpu, list[Segment]]:
    segments, text = generate(since, until, step, seed)
    path.write_text(text)
    return segments
