"""NVML GPM (GPU performance monitoring, Hopper and later): SM, tensor and DRAM activity between two samples.

Each watched device (a GPU, or a MIG instance through its parent and GPU instance id) has two GPM
samples allocated once; every `read` fills the older one and computes the metrics between the
previous fill and this one, so one NVML sample call per device per agent sample is all it costs.
The first read of a device has nothing to compare with and gives no values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

#: reading field -> (GPM metric constant in pynvml, its id there, scale to the field's unit)
GPM_METRICS: dict[str, tuple[str, int, float]] = {
    "gr_engine_active_pct": ("NVML_GPM_METRIC_GRAPHICS_UTIL", 1, 1.0),
    "sm_active_pct": ("NVML_GPM_METRIC_SM_UTIL", 2, 1.0),
    "tensor_active_pct": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 5, 1.0),
    "dram_active_pct": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 10, 1.0),
    "pcie_tx_bytes_s": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", 20, 1024.0 * 1024.0),  # MiB/s -> bytes/s
    "pcie_rx_bytes_s": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", 21, 1024.0 * 1024.0),
}

#: how a failing call is reported: (device index, function name, the call) -> its result or None
Call = Callable[..., Any]


@dataclass
class _Watched:
    handle: Any  # the GPU's handle (the parent's for a MIG instance)
    gi_id: int | None  # GPU instance id of a MIG instance
    samples: list[Any]
    filled: int = 0  # how many of the two samples hold data (0, 1 or 2)
    newest: int = 0  # index in `samples` of the newest fill


class GpmReader:
    """GPM metrics of the devices `watch` accepted; `call(index, name, *args)` makes one guarded NVML call."""

    def __init__(self, nvml: Any, call: Call) -> None:
        self.nv = nvml
        self.call = call
        self.watched: dict[int, _Watched] = {}
        self._metric_ids = [(f, int(getattr(nvml, const, default)), scale)
                            for f, (const, default, scale) in GPM_METRICS.items()]

    def supported(self, index: int, handle: Any) -> bool:
        """Whether the GPU behind `handle` has GPM (`nvmlGpmQueryDeviceSupport`)."""
        support = self.call(index, "nvmlGpmQueryDeviceSupport", handle)
        return bool(support is not None and getattr(support, "isSupportedDevice", 0))

    def watch(self, index: int, handle: Any, gi_id: int | None = None) -> bool:
        """Allocate the two samples of device `index`; False when the driver will not."""
        samples: list[Any] = []
        for _ in range(2):
            s = self.call(index, "nvmlGpmSampleAlloc")
            if s is None:
                self._free(index, samples)
                return False
            samples.append(s)
        self.watched[index] = _Watched(handle=handle, gi_id=gi_id, samples=samples)
        return True

    def read(self, index: int) -> dict[str, float]:
        """The metrics since the previous read of device `index`; empty when unknown, first or failed."""
        w = self.watched.get(index)
        if w is None:
            return {}
        target = 1 - w.newest if w.filled else 0
        sample = w.samples[target]
        if w.gi_id is None:
            got = self.call(index, "nvmlGpmSampleGet", w.handle, sample)
        else:
            got = self.call(index, "nvmlGpmMigSampleGet", w.handle, w.gi_id, sample)
        if got is None:
            w.filled = 0  # start over: never compare across a gap of unknown length
            return {}
        older, w.newest, w.filled = w.samples[w.newest], target, min(2, w.filled + 1)
        if w.filled < 2:
            return {}
        return self._metrics(index, older, sample)

    def _metrics(self, index: int, older: Any, newer: Any) -> dict[str, float]:
        nv = self.nv
        request = nv.c_nvmlGpmMetricsGet_t()
        request.version = nv.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(self._metric_ids)
        request.sample1 = older
        request.sample2 = newer
        for i, (_, metric_id, _) in enumerate(self._metric_ids):
            request.metrics[i].metricId = metric_id
        done = self.call(index, "nvmlGpmMetricsGet", request)
        if done is None:
            return {}
        out: dict[str, float] = {}
        for i, (field, _, scale) in enumerate(self._metric_ids):
            m = done.metrics[i]
            if int(m.nvmlReturn) == 0:  # NVML_SUCCESS; a metric this GPU lacks has its own code
                out[field] = round(float(m.value) * scale, 3)
        return out

    def _free(self, index: int, samples: list[Any]) -> None:
        for s in samples:
            try:
                self.nv.nvmlGpmSampleFree(s)
            except self.nv.NVMLError as e:
                log.debug("gpu %d: nvmlGpmSampleFree: %s", index, e)

    def forget(self, index: int) -> None:
        w = self.watched.pop(index, None)
        if w is not None:
            self._free(index, w.samples)

    def close(self) -> None:
        for index in list(self.watched):
            self.forget(index)
