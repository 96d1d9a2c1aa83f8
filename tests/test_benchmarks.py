"""The benchmark scripts run: each, briefly, against a daemon (or worker) it starts, and prints its figures.

Nothing here judges a figure (the machines are shared and noisy, see the performance page): a
script that no longer starts, crashes, or counts a failed execution fails here, before anyone
relies on its numbers. Every script in ``benchmarks/`` has a run here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
RUN_S = 240  # the bound of one script's run, start-up and warm-up included
EMPTY = "/nonexistent-quickjs-build"  # as --other-pythonpath: the other side runs this environment's build

# (script, its quickest arguments, patterns its output must match)
RUNS = [
    (
        "latency.py",
        ["--rounds", "1", "--runs", "3"],
        [r"hardened +1 tool +n=3 ", r"a tool call adds", r"failures: 0\n"],
    ),
    (
        "neighbours.py",
        ["--rounds", "4", "--spinners", "2"],
        [r"2 guests spinning", r"cancel, guest awaiting a tool +n=4 ", r"log kept in 1/1", r"timeout \(300 ms\)"],
    ),
    (
        "tenants.py",
        ["--spinners", "4", "--spin-timeout", "500", "--executions", "6", "--rounds", "1"],
        [
            r"b alone +n=6 ",
            r"b beside a +n=6 ",
            r"b's p99 beside a / alone: [\d.]+x",
            r"a's CPU .*: [\d.]+ of \d+ cores",
        ],
    ),
    (
        "parked.py",
        ["--n", "20", "--delay", "1"],
        [
            r"ok 20, refused \(503\) 0, failed 0",
            r"20 of 20 parked",
            r"the ramp's CPU per execution: daemon \d+ us, workers \d+ us \(their busiest thread \d+ us\)",
        ],
    ),
    (
        "throughput.py",
        ["--tools", "--cpus", "0", "0,1", "--concurrency", "2", "--rounds", "1", "--duration", "0.3"],
        [r"cpus 0,1 +10 parallel +2 ", r"what a tool call adds", r"cpus 0,1 c=2: -?\d+, -?\d+, -?\d+"],
    ),
    (
        "throughput.py",
        ["--floor", "--concurrency", "4", "--rounds", "2", "--duration", "0.3"],
        [r"floor +1\+1 +4 ", r"daemon +1\+1 +4 ", r"a bare QuickJS context made and freed: \d+ us"],
    ),
    (
        "throughput.py",
        ["--other", str(REPO), "--concurrency", "4", "--rounds", "2", "--duration", "0.3"],
        [r"other +1\+1 +4 ", r"paired: this lower in \d of 2 pairs"],
    ),
    (
        "throughput.py",
        ["--other", str(REPO), "--floor", "--concurrency", "4", "--rounds", "1", "--duration", "0.3"],
        [r"this +1\+1 +4 .* 0 +\d+\n", r"paired: this lower in \d of 1 pairs"],
    ),
    (
        "runtime_cost.py",
        ["--chunks", "2", "--size", "5"],
        [r"trivial execution \(GuestRun, start to Finished\) +\d", r"a \d+-character program normalized +\d"],
    ),
    (
        "runtime_cost.py",
        ["--chunks", "2", "--size", "5", "--other-pythonpath", EMPTY, "--rounds", "1"],
        [r"round 1 other", r"a fresh runtime freed +[\d.]+- *[\d.]+ against"],
    ),
    (
        "worker_start.py",
        ["--workers", "2"],
        [r"hardened \(1 thread\) +[\d.]+ +[\d.]+ +[\d.]+ +[\d.]+ +\d+ +\d+\n", r"standard, no confinement +[\d.]+"],
    ),
    (
        "worker_steady.py",
        ["--duration", "0.5", "--in-flight", "4", "--tools", "2"],
        [r"2 tool calls each", r"\d+ executions/s", r"ms CPU per execution"],
    ),
    (
        "worker_steady.py",
        ["--duration", "0.3", "--in-flight", "4", "--other-pythonpath", EMPTY, "--pairs", "1"],
        [r"paired: this lower in \d of 1 pairs"],
    ),
    (
        "worker_replay.py",
        ["--tools", "2", "--in-flight", "1,4", "--executions", "20", "--rounds", "2"],
        [r"round 2: 1 in flight \d+, 4 in flight \d+", r"4 in flight: median +\d+ us"],
    ),
]


def run(script: str, arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, script, *arguments],
        cwd=BENCHMARKS,
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )


def flags(run: tuple[str, list[str], list[str]]) -> str:
    """A run's test id: the script and its options without their values."""
    return " ".join([run[0], *(argument for argument in run[1] if argument.startswith("--"))])


@pytest.mark.parametrize(("script", "arguments", "expected"), RUNS, ids=[flags(run) for run in RUNS])
def test_a_benchmark_runs_and_prints_its_figures(script: str, arguments: list[str], expected: list[str]) -> None:
    if "--cpus" in arguments and shutil.which("taskset") is None:
        pytest.skip("taskset is not installed")
    done = run(script, arguments)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    for pattern in expected:
        assert re.search(pattern, done.stdout), f"{pattern!r} not in:\n{done.stdout[-3000:]}"
    assert "FAILURES" not in done.stdout, done.stdout[-3000:]


def test_every_script_has_a_run_here() -> None:
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    assert scripts == {script for script, _, _ in RUNS} | {
        "execbox_host.py",
        "differential.py",
        "differential_corpus.py",
    }


def test_the_reference_side_by_side_needs_an_execbox_checkout() -> None:
    """``execbox_host.py`` runs execbox's TypeScript host from a checkout of aallam/execbox, which
    this machine need not have: its options parse, and without a checkout it says so and stops
    before starting anything."""
    helped = run("execbox_host.py", ["--help"])
    assert helped.returncode == 0, helped.stderr
    assert "--execbox" in helped.stdout and "--suites" in helped.stdout
    refused = run("execbox_host.py", ["--execbox", "/nonexistent", "--rounds", "1"])
    assert refused.returncode == 1
    assert "not an execbox checkout" in refused.stderr


def test_the_differential_run_needs_an_execbox_checkout() -> None:
    """``differential.py`` also runs execbox's host from a checkout: its options parse, and without
    one it says so and stops before starting anything."""
    helped = run("differential.py", ["--help"])
    assert helped.returncode == 0, helped.stderr
    assert "--execbox" in helped.stdout and "--cases" in helped.stdout
    refused = run("differential.py", ["--execbox", "/nonexistent"])
    assert refused.returncode == 1
    assert "not an execbox checkout" in refused.stderr


def test_the_differential_corpus_names_each_case_once_and_gives_only_known_options() -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from differential_corpus import corpus
    finally:
        sys.path.remove(str(BENCHMARKS))
    cases = corpus()
    assert len({c["name"] for c in cases}) == len(cases) >= 80
    known = {"timeoutMs", "memoryLimitBytes", "maxLogLines", "maxLogChars"}
    assert all(set(c["options"]) <= known and isinstance(c["code"], str) for c in cases)
