"""What the daemon learns of its machine: the cores it may really use."""

from __future__ import annotations

import os
import subprocess
import sys

from execbox_runner.daemon.machine import default_processes, usable_cores

from .daemonkit import running_daemon
from .test_startup_line import startup_lines

PRINT_CORES = "from execbox_runner.daemon.machine import usable_cores; print(usable_cores())"


def test_the_usable_cores_are_those_of_the_affinity_mask() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_a_process_pinned_to_one_core_counts_one() -> None:
    """As under ``taskset -c 0`` (or a cpuset): os.cpu_count() would still say every core."""
    pinned = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", PRINT_CORES],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert pinned.stdout.strip() == "1"


def shards_started(cores: set[int]) -> list[str]:
    """The ``shard`` of each start-up line of a default daemon started on ``cores`` only."""
    original = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)  # inherited by the daemon, as under taskset
    try:
        with running_daemon("--processes", "0") as daemon:
            return sorted(line["shard"] for line in startup_lines(daemon))
    finally:
        os.sched_setaffinity(0, original)


def test_one_daemon_process_serves_per_two_usable_cores() -> None:
    assert [default_processes(cores) for cores in (1, 2, 3, 4, 5, 8, 64)] == [1, 1, 1, 2, 2, 4, 32]


def test_by_default_a_daemon_starts_the_processes_its_usable_cores_call_for() -> None:
    """Pinned to one core, and on this machine's cores: a supervisor only where they call for two
    or more daemon processes."""
    cores = os.sched_getaffinity(0)
    assert shards_started({min(cores)}) == [""]  # one core: no supervisor, one daemon
    expected = default_processes(len(cores))
    shards = [""] if expected == 1 else [f"{index}/{expected}" for index in range(expected)]
    assert shards_started(cores) == shards
