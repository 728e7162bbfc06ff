"""The machines a plan is made for: ranks and the memory each rank has.

:class:`Topology` is plain data. :meth:`Topology.detect` reads this machine and
is only called by the command line; the planner itself never looks at the
machine, so the same (recipe, topology) gives the same plan everywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embtrain.recipe.kinds import TIER_KINDS, TIERS

POOLS = TIER_KINDS  # memory pools, named as the tiers that live in them
#: The :class:`Topology` fields holding each pool's bytes per rank, in pool order.
CAPACITY_FIELDS: tuple[str, ...] = tuple(TIERS[p].capacity for p in POOLS)


@dataclass(frozen=True)
class Topology:
    """``world_size`` ranks, each with this much device memory, host memory and disk (bytes).

    ``device_memory`` is None when ranks have no GPU: the ``device`` tier is then
    served from host memory and counts against ``host_memory``.
    """

    world_size: int
    device_memory: int | None
    host_memory: int
    disk: int

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")
        for name in CAPACITY_FIELDS:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must not be negative, got {value}")

    @property
    def has_device(self) -> bool:
        """Whether ranks have a GPU (a device memory of their own)."""
        return self.device_memory is not None

    def capacity(self, pool: str) -> int:
        """Bytes per rank of ``pool`` (device, host or disk); 0 for device without a GPU."""
        return getattr(self, TIERS[pool].capacity) or 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping."""
        return {"world_size": self.world_size,
                **{name: getattr(self, name) for name in CAPACITY_FIELDS}}

    @classmethod
    def detect(cls, world_size: int, local_ranks: int | None = None) -> Topology:
        """Read this machine: memory and disk divided among the ranks that run on it.

        Stable figures (total memory and disk less a reserve, see :func:`usable_host_memory`),
        so the same machine gives the same plan and fingerprint every time.

        ``local_ranks`` defaults to one rank per GPU (at most ``world_size``) or,
        without a GPU, ``world_size``.
        """
        return detect_topology(world_size, local_ranks)


def detect_topology(world_size: int, local_ranks: int | None = None) -> Topology:
    """See :meth:`Topology.detect`."""
    gpus = gpu_memories()
    if local_ranks is None:
        local_ranks = min(world_size, len(gpus)) if gpus else world_size
    local_ranks = max(1, local_ranks)
    host = usable_host_memory() // local_ranks
    disk = usable_disk(Path(os.getcwd())) // local_ranks
    device = min(gpus) if gpus else None
    return Topology(world_size=world_size, device_memory=device, host_memory=host, disk=disk)


GiB = 1 << 30
RESERVE_FRACTION = 0.10  # of memory and disk, left to the OS, the dense model and other processes
RESERVE_MIN = 2 * GiB


def _less_reserve(total: int) -> int:
    """``total`` less the reserve (10 %, at least 2 GiB), rounded down to a whole GiB."""
    usable = total - max(RESERVE_MIN, int(total * RESERVE_FRACTION))
    return max(0, usable) // GiB * GiB


def usable_host_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Host memory the planner may use: MemTotal less the reserve, in whole GiB.

    Stable while the machine is unchanged (unlike MemAvailable, which moves every second),
    so every run and every rank plans with the same figure.
    """
    return _less_reserve(total_memory_bytes(meminfo))


def usable_disk(path: Path) -> int:
    """Disk the planner may use under ``path``: the file system's size less the reserve, in
    whole GiB (free space moves with every file written; a disk tier checks it before use)."""
    return _less_reserve(shutil.disk_usage(path).total)


def _meminfo_bytes(meminfo: Path, keys: tuple[str, ...]) -> int:
    """The first of ``keys`` found in a /proc/meminfo-style file, in bytes; total physical
    memory where the file cannot be read or holds none of them."""
    try:
        fields: dict[str, int] = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
        for key in keys:
            if key in fields:
                return fields[key]
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - exotic platforms
        return 0


def total_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemTotal of this machine in bytes (physical memory where /proc/meminfo is absent)."""
    return _meminfo_bytes(meminfo, ("MemTotal",))


def host_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable (else MemTotal) of this machine in bytes; total physical memory elsewhere."""
    return _meminfo_bytes(meminfo, ("MemAvailable", "MemTotal"))


def gpu_memories() -> list[int]:
    """Memory of each GPU in bytes, from ``nvidia-smi``; empty when it does not answer."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    sizes = []
    for line in out.splitlines():
        line = line.strip()
        if line.isdigit():
            sizes.append(int(line) * 2**20)
    return sizes
