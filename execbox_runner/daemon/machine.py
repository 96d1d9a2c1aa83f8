"""What this machine (or container) offers the daemon, for defaults sized from it.

Memory is the cgroup's limit where one is set (a container), else the
machine's. Open descriptors are raised to the hard limit at start-up: every
session is a socket, and the common soft limit of 1,024 would cap sessions
long before memory does.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path
from typing import Final

# The share of memory guest heaps and sessions may use; the rest is the daemon's and the kernel's.
BUDGET_SHARE: Final = 0.8
# What one admitted session may cost at most while parked (daemon side, runtime, guest heap slack).
SESSION_COST_BYTES: Final = 1 << 20
MAX_AUTO_SESSIONS: Final = 20_000
# Descriptors kept for everything that is not a session (workers' channels, listeners, files).
RESERVED_FDS: Final = 256
PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def memory_bytes() -> int:
    """The cgroup v2 (or v1) memory limit if set, else the machine's memory."""
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
    with Path("/proc/meminfo").open() as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise OSError("cannot read the machine's memory from /proc/meminfo")


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (``taskset``, cpusets), capped by a
    cgroup CPU quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``) rounded up; never fewer than 1."""
    cores = len(os.sched_getaffinity(0))
    for quota_file, period_file in (
        (Path("/sys/fs/cgroup/cpu.max"), None),
        (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")),
    ):
        try:
            fields = quota_file.read_text().split()
            if period_file is not None:
                fields.append(period_file.read_text().strip())
            quota, period = int(fields[0]), int(fields[1])
        except (OSError, ValueError, IndexError):
            continue  # absent, or "max": no quota
        if quota > 0 and period > 0:
            cores = min(cores, -(-quota // period))
    return max(1, cores)


def default_processes(cores: int) -> int:
    """Daemon processes for ``cores`` usable cores: one per two. A daemon process spends about as
    much CPU per execution as the workers it feeds, so each needs a core for itself and one for
    its workers; on two cores, two daemon processes serve fewer executions a second than one
    (``benchmarks/throughput.py --cpus 0 0,1`` measures it)."""
    return max(1, cores // 2)


def raise_open_files() -> int:
    """Raise the soft descriptor limit to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def default_memory_budget(memory: int) -> int:
    """What the daemon's process tree may hold by default: a share of the machine or container."""
    return int(memory * BUDGET_SHARE)


def resident_bytes(pids: list[int]) -> int:
    """Resident memory of these processes (gone ones count nothing)."""
    total = 0
    for pid in pids:  # several times a second: os calls, not file objects (8 us a process, not 34)
        try:
            fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY)
            try:
                total += int(os.read(fd, 256).split()[1]) * PAGE_BYTES
            finally:
                os.close(fd)
        except (OSError, ValueError, IndexError):
            continue
    return total


def default_max_sessions(memory: int, open_files: int) -> int:
    """Sessions admitted by default: as many as memory and descriptors carry, within a sane cap."""
    by_memory = int(memory * BUDGET_SHARE) // SESSION_COST_BYTES
    return max(1, min(MAX_AUTO_SESSIONS, by_memory, open_files - RESERVED_FDS))


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) a process has spent; None once it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            fields = os.read(fd, 1024).rsplit(b")", 1)[1].split()
        finally:
            os.close(fd)
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None
