"""MIG profile tables: the slices each GPU model can be cut into, their memory and their share of the compute.

From NVIDIA's MIG user guide ("Supported MIG Profiles"). A profile `Ng.Mgb` has N of the GPU's compute slices
(7 on A100, H100, H200 and B200; 4 on A30) and a fixed fraction of its memory. Usable memory is taken as the
profile's nominal gigabytes in MiB less 5 %, a little under what NVML reports for each profile, so that advice
never counts on memory a slice does not have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB_PER_GB = 1000**3 / 1024**2  # the profiles' "gb" are decimal gigabytes
USABLE = 0.95


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile of one GPU model."""

    name: str  # "3g.20gb"
    compute_slices: int  # N of `Ng`
    total_slices: int  # the GPU's compute slices (7, or 4 on A30)
    memory_fraction: float  # of the whole GPU's memory
    max_instances: int

    @property
    def memory_mib(self) -> float:
        gb = float(self.name.split(".")[1].removesuffix("gb"))
        return gb * MIB_PER_GB * USABLE

    @property
    def compute_share(self) -> float:
        """Its share of the GPU's compute, and so of the GPU's cost (3 of 7 slices cost 3/7)."""
        return self.compute_slices / self.total_slices


def _seven(mem_gb: tuple[int, int, int, int]) -> tuple[MigProfile, ...]:
    """The A100/H100/H200/B200 layout: 1g (1/8 memory), 1g (2/8), 2g (2/8), 3g (4/8), 4g (4/8), 7g (all)."""
    eighth, quarter, half, full = mem_gb
    return (
        MigProfile(f"1g.{eighth}gb", 1, 7, 1 / 8, 7),
        MigProfile(f"1g.{quarter}gb", 1, 7, 2 / 8, 4),
        MigProfile(f"2g.{quarter}gb", 2, 7, 2 / 8, 3),
        MigProfile(f"3g.{half}gb", 3, 7, 4 / 8, 2),
        MigProfile(f"4g.{half}gb", 4, 7, 4 / 8, 1),
        MigProfile(f"7g.{full}gb", 7, 7, 1.0, 1),
    )


# Model patterns (lower case, matched in order, most specific first) → that model's profiles.
PROFILES: tuple[tuple[str, tuple[MigProfile, ...]], ...] = (
    ("a100.*80", _seven((10, 20, 40, 80))),
    ("a100", _seven((5, 10, 20, 40))),
    ("a30", (
        MigProfile("1g.6gb", 1, 4, 1 / 4, 4),
        MigProfile("2g.12gb", 2, 4, 2 / 4, 2),
        MigProfile("4g.24gb", 4, 4, 1.0, 1),
    )),
    ("h100.*(94|nvl)", _seven((12, 24, 47, 94))),
    ("h100", _seven((10, 20, 40, 80))),
    ("h200", _seven((18, 35, 71, 141))),
    ("gh200", _seven((12, 24, 48, 96))),
    ("b200", _seven((23, 45, 90, 180))),
)
# GH200 must be looked up before H200 ("gh200" contains "h200").
_ORDER = sorted(PROFILES, key=lambda kv: 0 if kv[0] == "gh200" else 1)

_SLICES = re.compile(r"\bmig\s+(\d+)g\.(\d+)gb", re.IGNORECASE)


def profiles_of(model: str | None) -> tuple[MigProfile, ...]:
    """The MIG profiles of a GPU model name as NVML writes it (`NVIDIA H100 80GB HBM3`), smallest first; none for a
    model without MIG or an unknown one."""
    if not model:
        return ()
    name = model.lower()
    for pattern, profiles in _ORDER:
        if re.search(pattern, name):
            return profiles
    return ()


def instance_profile(model: str | None) -> MigProfile | None:
    """The profile of a MIG instance from its model name (`NVIDIA A100-SXM4-40GB MIG 3g.20gb`), or None."""
    if not model:
        return None
    m = _SLICES.search(model)
    if m is None:
        return None
    wanted = f"{m.group(1)}g.{m.group(2)}gb"
    parent = model[: m.start()]
    for p in profiles_of(parent):
        if p.name == wanted:
            return p
    return None
