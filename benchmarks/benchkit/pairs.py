"""Two sides measured in alternated pairs, and the pairs compared one by one (``throughput.py
--other``, ``worker_steady.py``, ``runtime_cost.py``).

On this shared machine a figure moves by far more from hour to hour than a change moves it: only
runs alternated under the same conditions compare, and a change of a few percent shows in how
many pairs one side was lower (and by how much at the median) sooner than in the sides' medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import version
from typing import TypeVar

from .processes import with_pythonpath

T = TypeVar("T")
SIDES = ("this", "other")


def alternated(pairs: int, run: Callable[[str, int], T]) -> dict[str, list[T]]:
    """``run(side, pair)`` for both sides ``pairs`` times: "this" first in even pairs, "other" in odd
    ones, so that a drift of the machine's load falls on both alike."""
    results: dict[str, list[T]] = {side: [] for side in SIDES}
    for pair in range(pairs):
        for side in SIDES if pair % 2 == 0 else SIDES[::-1]:
            results[side].append(run(side, pair))
    return results


def summary(results: dict[str, list[float]], *, scale: float = 1.0, digits: int = 0) -> list[str]:
    """Each side's range and median in microseconds (its figures times ``scale``), then the pairs
    compared: the closing lines of a run of one figure per side."""
    lines = []
    for side, figures in results.items():
        low, high, middle = (figure * scale for figure in (min(figures), max(figures), statistics.median(figures)))
        lines.append(f"  {side:<6} {low:.{digits}f}-{high:.{digits}f} us, median {middle:.{digits}f}")
    ratios = [a / b for a, b in zip(results["this"], results["other"], strict=True) if a and b]
    lower, ratio = sum(ratio < 1 for ratio in ratios), statistics.median(ratios) if ratios else float("nan")
    lines.append(f"  paired: this lower in {lower} of {len(ratios)} pairs; this / other at the median {ratio:.3f}")
    return lines


def build_options(parser: argparse.ArgumentParser, rounds: int) -> None:
    """The options of a script that measures QuickJS builds: ``--other-pythonpath DIR``, ``--rounds``
    (default ``rounds``) and the hidden ``--json`` its alternated runs answer with."""
    parser.add_argument(
        "--other-pythonpath", help="a QuickJS build to alternate with (deploy/quickjs/build.py --target)"
    )
    parser.add_argument("--rounds", type=int, default=rounds, help="runs per side with --other-pythonpath")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)


def measured_builds(
    args: argparse.Namespace, script: str, arguments: list[str], unit: str, measure: Callable[[], dict[str, float]]
) -> None:
    """What a script of ``build_options`` prints: with ``--other-pythonpath``, ``script arguments``
    run ``--rounds`` times per build, alternated, and each side's range per figure; else this
    build's ``measure()``, as one JSON object with ``--json``, or a line per figure in ``unit``."""
    if args.other_pythonpath:
        _alternated_builds(script, arguments, args.other_pythonpath, args.rounds, unit)
        return
    figures = measure()
    if args.json:
        print(json.dumps(figures))
        return
    print(f"{unit} (quickjs-ng {version('quickjs-ng')}):")
    for name, value in figures.items():
        print(f"  {name:<48} {value:7.1f}")


def _alternated_builds(script: str, arguments: list[str], other_pythonpath: str, rounds: int, unit: str) -> None:
    """``rounds`` runs per side of ``script --json arguments`` (which prints its figures as one JSON
    object), alternated, "other" with ``other_pythonpath`` first on its path (a QuickJS build made
    with ``deploy/quickjs/build.py --target``); prints every run, then each side's range per figure."""
    command = [sys.executable, script, *arguments, "--json"]

    def run(side: str, pair: int) -> dict[str, float]:
        env = with_pythonpath(other_pythonpath if side == "other" else None)
        out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=True).stdout
        figures: dict[str, float] = json.loads(out)
        print(f"  round {pair + 1} {side:<5} {' / '.join(f'{value:.1f}' for value in figures.values())}", flush=True)
        return figures

    results = alternated(rounds, run)
    print(f"{unit}; this / other = PYTHONPATH {other_pythonpath}:")
    for name in results["this"][0]:
        this = [figures[name] for figures in results["this"]]
        other = [figures[name] for figures in results["other"]]
        print(f"  {name:<48} {min(this):6.1f}-{max(this):6.1f} against {min(other):6.1f}-{max(other):6.1f}")
