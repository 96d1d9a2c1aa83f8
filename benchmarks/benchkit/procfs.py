"""CPU accounting from /proc: the daemon, its whole worker tree (live and reaped), and the machine.

Read from outside the daemon so that measuring costs it nothing, and so that
workers recycled during a run are still counted.
"""

from __future__ import annotations

import os
import time
from typing import Final

CLK_TCK: Final = os.sysconf("SC_CLK_TCK")
PAGE_BYTES: Final = os.sysconf("SC_PAGE_SIZE")


def _stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat from field 3 (state) on: field N is at index N - 3."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2 :].split()


def _proc_times(pid: int) -> tuple[int, int, int]:
    """(ppid, own CPU ticks, CPU ticks of reaped children) from /proc/PID/stat."""
    fields = _stat_fields(pid)
    # ppid is field 4, utime/stime/cutime/cstime are fields 14-17.
    return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])


def minor_faults(pid: int) -> tuple[int, int]:
    """(the process's own minor page faults, those of its reaped children): fields 10 and 11."""
    fields = _stat_fields(pid)
    return int(fields[7]), int(fields[8])


def _process_table() -> dict[int, tuple[int, int, int]]:
    """``_proc_times`` of every process on the box, by PID (one scan of /proc)."""
    table: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                table[int(name)] = _proc_times(int(name))
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
    return table


def _descendants(table: dict[int, tuple[int, int, int]], root: int) -> list[int]:
    """The live descendants of ``root`` in ``table`` (children, grandchildren, ...)."""
    descendants: list[int] = []
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, (ppid, _, _) in table.items() if ppid == parent]
        descendants += kids
        frontier += kids
    return descendants


def tree_cpu_seconds(root: int) -> tuple[float, float, int]:
    """(CPU seconds of ``root`` itself, of all its descendants live or reaped, live descendants).

    The daemon's workers are children of its zygote (itself a child of the
    daemon), so the whole process tree counts. A process that exits between
    two samples moves from "live" into its parent's reaped-children counters,
    so differences of the second figure stay right. A process reaped during
    the /proc scan would be missed (or counted twice), so the scan is retried
    while the reaped counters move.
    """
    for _ in range(10):
        table = _process_table()
        descendants = _descendants(table, root)
        reaped = sum(table[pid][2] for pid in [root, *descendants] if pid in table)
        live = sum(table[pid][1] for pid in descendants)
        if sum(_proc_times(pid)[2] for pid in [root, *descendants] if os.path.exists(f"/proc/{pid}")) == reaped:
            break
    own = table[root][1] if root in table else 0
    return own / CLK_TCK, (reaped + live) / CLK_TCK, len(descendants)


def tree_thread_cpu_ns(root: int) -> dict[tuple[int, int], int]:
    """CPU nanoseconds of every thread of ``root`` and its live descendants, by (PID, thread ID):
    the scheduler's own count (``schedstat``), finer than the clock ticks of ``stat``."""
    threads: dict[tuple[int, int], int] = {}
    for pid in [root, *_descendants(_process_table(), root)]:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited meanwhile
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as schedstat:
                    threads[pid, int(tid)] = int(schedstat.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return threads


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


def wait_pool_settled(daemon_pid: int, limit_s: float = 20.0) -> tuple[float, int]:
    """Wait (at most ``limit_s``) until the daemon's workers stop starting: same count and
    under 5% of a core of worker CPU over half a second. Returns (seconds waited, workers)."""
    t0 = time.perf_counter()
    _, cpu, count = tree_cpu_seconds(daemon_pid)
    while time.perf_counter() - t0 < limit_s:
        time.sleep(0.5)
        _, cpu_now, count_now = tree_cpu_seconds(daemon_pid)
        settled = count_now == count and cpu_now - cpu < 0.025
        cpu, count = cpu_now, count_now
        if settled:
            break
    return time.perf_counter() - t0, count


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid``; 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_BYTES
    except OSError:
        return 0


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and every live descendant (daemon, zygote, workers)."""
    return sum(rss_bytes(pid) for pid in [root, *_descendants(_process_table(), root)])
