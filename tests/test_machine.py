"""What the daemon learns of its machine: the cores it may really use."""

from __future__ import annotations

import os
import subprocess
import sys

from execbox_runner.daemon.machine import usable_cores

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
