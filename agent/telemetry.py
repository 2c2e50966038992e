"""The machine's own figures for the heartbeat: CPUs, load, memory and ``/dev/shm``.

All read from the kernel at the moment of the heartbeat; nothing is estimated. ``/dev/shm`` matters
because engines pass tensors through it, and a container's default 64 MiB refuses remote starts
(``insufficient_shared_memory``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
SHM = Path("/dev/shm")  # noqa: S108 -- measured, never written to


@dataclass(frozen=True)
class HostReading:
    """CPU, memory and shared-memory figures of the machine the agent runs on."""

    cpu_count: int
    load_1m: float
    memory_total_bytes: int
    memory_available_bytes: int
    shm_total_bytes: int
    shm_free_bytes: int


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask), which a container's cpuset narrows."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def read_meminfo(path: Path = MEMINFO) -> tuple[int, int]:
    """``(MemTotal, MemAvailable)`` in bytes from ``/proc/meminfo`` (which reports kB)."""
    fields: dict[str, int] = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    total = fields["MemTotal"]
    # MemAvailable exists since Linux 3.14; before that, free + page cache is the usual estimate.
    available = fields.get("MemAvailable", fields.get("MemFree", 0) + fields.get("Cached", 0))
    return total, available


def read_shm(path: Path = SHM) -> tuple[int, int]:
    """``(total, free)`` bytes of the shared-memory filesystem; ``(0, 0)`` where there is none."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return 0, 0
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize


def read_host() -> HostReading:
    total, available = read_meminfo()
    shm_total, shm_free = read_shm()
    return HostReading(
        cpu_count=cpu_count(),
        load_1m=round(os.getloadavg()[0], 2),
        memory_total_bytes=total,
        memory_available_bytes=available,
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
    )
