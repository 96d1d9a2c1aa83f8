"""The benchmark scripts run: each, briefly, against a daemon it starts, and prints its figures.

Nothing here judges a figure (the machines are shared and noisy, see the performance page): a
script that no longer starts, crashes, or counts a failed execution fails here, before anyone
relies on its numbers.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
RUN_S = 240  # the bound of one script's run, start-up and warm-up included


@pytest.mark.parametrize(
    ("script", "arguments", "expected"),
    [
        ("toolcalls.py", ["--rounds", "1", "--duration", "0.5", "--concurrency", "1,4"], "what a tool call adds"),
        ("latency.py", ["--rounds", "1", "--runs", "3"], "failures: 0"),
        ("parked.py", ["--n", "20", "--delay", "0.2"], "ok"),
    ],
)
def test_a_benchmark_runs_and_prints_its_figures(script: str, arguments: list[str], expected: str) -> None:
    done = subprocess.run(
        [sys.executable, script, *arguments],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert expected in done.stdout, done.stdout[-2000:]
    assert "failures" not in done.stdout.replace("failures: 0", "").replace("failures 0", ""), done.stdout[-2000:]
