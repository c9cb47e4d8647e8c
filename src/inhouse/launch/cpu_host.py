"""A CPU host's cores and memory, shared out between the replicas it runs: each gets its own
cores, so their threads never share one, and a share of the free memory. A replica whose
threads follow its cores (`Engine.follows_cores`) can be moved to another share while it
runs (`pin`), so the replicas serving split the cores however many there are."""

from __future__ import annotations

import os
from pathlib import Path

KV_SHARE_OF_AVAILABLE = 0.25  # of the host's free memory, for all its replicas' KV caches


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask), in order."""
    return tuple(sorted(os.sched_getaffinity(0)))


def split_cores(cores: tuple[int, ...], replicas: int) -> list[tuple[int, ...]]:
    """`cores` in `replicas` contiguous runs as even as can be; with fewer cores than
    replicas, each replica gets one and they go round the cores."""
    if replicas > len(cores):
        return [(cores[i % len(cores)],) for i in range(replicas)]
    share, extra = divmod(len(cores), replicas)
    runs, start = [], 0
    for index in range(replicas):
        size = share + (1 if index < extra else 0)
        runs.append(cores[start : start + size])
        start += size
    return runs


def pin(pid: int, cores: tuple[int, ...]) -> None:
    """Let every thread of process `pid` run on `cores` only (threads it starts later
    inherit that); a process that has exited is left alone."""
    for _ in range(2):  # a thread started while the first pass ran, from an unpinned one
        try:
            threads = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for thread in threads:
            try:
                os.sched_setaffinity(int(thread), cores)
            except OSError:
                continue  # that thread has just ended


def share_cores(pids: list[int]) -> list[tuple[int, ...]]:
    """Split this process's cores between processes `pids` (`split_cores`, in order) and
    pin each to its share; the shares."""
    shares = split_cores(usable_cores(), len(pids)) if pids else []
    for pid, cores in zip(pids, shares, strict=True):
        pin(pid, cores)
    return shares


def core_list(cores: tuple[int, ...]) -> str:
    """The cores as a Linux CPU list: (0, 1, 2, 5) -> "0-2,5"."""
    ranges: list[str] = []
    ordered = sorted(cores)
    start = prev = ordered[0]
    for core in [*ordered[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        ranges.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(ranges)


def available_memory() -> int:
    """Bytes the host can still hand out (MemAvailable), or all of it where that is unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def kv_share(cores: tuple[int, ...]) -> int:
    """A KV budget for a server on `cores`: its cores' share of a quarter of the free memory,
    so replicas that split the host's cores split that memory too."""
    share = len(cores) / len(usable_cores()) if cores else 1.0
    return int(available_memory() * KV_SHARE_OF_AVAILABLE * min(share, 1.0))
