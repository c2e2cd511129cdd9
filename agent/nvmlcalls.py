"""Guarded NVML calls: timed, unsupported queries remembered and read as None, other errors logged once."""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("agent.nvml")

MIB = 1024 * 1024


class NvmlUnavailable(Exception):
    """NVML did not load or initialise on this machine (no driver, no GPU, no library)."""


class GpuLost(Exception):
    """A query answered NVML_ERROR_GPU_IS_LOST."""


@dataclass
class _Device:
    index: int
    handle: Any
    uuid: str
    model: str | None
    mig_parent: str | None = None
    is_mig_parent: bool = False
    lost: bool = False
    pci_bus_id: str | None = None
    gi_id: int | None = None  # a MIG instance's GPU instance id
    profile: str | None = None  # a MIG instance's profile, `1g.10gb`
    xid_watched: bool = False
    samples: int = 0
    slow: dict[str, Any] = field(default_factory=dict)  # the last reading of each slow counter
    last_util_ts: int = 0
    #: pid -> (timestamp in µs, SM %) of its newest per-process sample
    proc_util: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class CallStats:
    """Latency of one NVML function across calls, for the real-GPU check."""

    calls: int = 0
    errors: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    codes: set[int] = field(default_factory=set)


def _handle_key(handle: Any) -> Any:
    """Handles are ctypes pointers: equal devices have equal addresses, not equal objects."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def mig_profile(name: str | None) -> str | None:
    """`1g.10gb` from a MIG instance's name as NVML gives it: `NVIDIA H100 80GB HBM3 MIG 1g.10gb`."""
    if not name or " MIG " not in name:
        return None
    return name.rsplit(" MIG ", 1)[1].strip() or None


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


class NvmlCaller:
    """Makes NVML calls for a sampler: `_call(index, name, *args)` never raises but for a lost GPU."""

    def __init__(self, nvml: Any, *, timing: bool = False) -> None:
        self.nv = nvml
        self.timing = timing
        self.stats: dict[str, CallStats] = {}
        self.errors: list[str] = []
        self._unsupported: set[tuple[int, str]] = set()
        self._warned: set[tuple[int, str, int]] = set()

    def _time(self, name: str, fn: Any, *args: Any) -> Any:
        if not self.timing:
            return fn(*args)
        st = self.stats.setdefault(name, CallStats())
        t0 = time.perf_counter()
        try:
            return fn(*args)
        except self.nv.NVMLError as e:
            st.errors += 1
            st.codes.add(int(e.value))
            raise
        finally:
            dt = time.perf_counter() - t0
            st.calls += 1
            st.total_s += dt
            st.max_s = max(st.max_s, dt)

    def _call(self, index: int, name: str, *args: Any, key: str | None = None) -> Any:
        """One NVML call; None when unsupported or failing. Raises GpuLost for a lost GPU.

        `key` names the query when one function answers several (clocks by type): unsupported is
        remembered per (device, key)."""
        key = key or name
        if (index, key) in self._unsupported:
            return None
        fn = getattr(self.nv, name, None)
        if fn is None:
            self._unsupported.add((index, key))
            return None
        try:
            return self._time(key, fn, *args)
        except self.nv.NVMLError as e:
            code = int(e.value)
            if code == self.nv.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(name) from None
            if code in self._unsupported_codes():
                self._unsupported.add((index, key))
                return None
            if (index, name, code) not in self._warned:
                self._warned.add((index, name, code))
                msg = f"gpu {index}: {name} failed: {e} (code {code})"
                self.errors.append(msg)
                log.warning("%s; reported as null", msg)
            return None

    def _unsupported_codes(self) -> tuple[int, ...]:
        nv = self.nv
        return (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND,
                getattr(nv, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25))

    def _static(self, index: int, name: str, *args: Any) -> str | None:
        try:
            value = self._call(index, name, *args)
        except GpuLost:
            return None
        return None if value is None else _text(value)

    # ------------------------------------------------------------ setup
