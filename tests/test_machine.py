"""What the daemon learns of its machine: the cores it may really use."""

from __future__ import annotations

import os
import subprocess
import sys

from execbox_runner.daemon.machine import usable_cores

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


def test_by_default_one_daemon_process_serves_per_usable_core() -> None:
    cores = os.sched_getaffinity(0)
    assert shards_started({min(cores)}) == [""]  # one core: no supervisor, one daemon
    if len(cores) > 1:
        assert shards_started(cores) == [f"{index}/{len(cores)}" for index in range(len(cores))]
