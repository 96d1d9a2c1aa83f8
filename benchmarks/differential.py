"""This daemon against execbox's reference runner, case by case, through execbox's TypeScript host.

Runs every case of ``differential_corpus.py`` (guest code, the tools it may call and what each
answers, runtime options) through execbox's ``RemoteExecutor`` (``execbox_host/differential.ts``)
against this daemon and against the reference QuickJS endpoint, each case on a fresh connection,
and prints the cases whose outcomes differ: ``ok``, the result (its JSON and the type the host
got), the error's code and message, the logs. Nothing run-dependent is in an outcome (no
durations), so nothing is normalized. ``--all`` prints every case's two outcomes; ``--cases``
runs only the cases whose names contain one of the given words.

    python benchmarks/differential.py --execbox PATH [--cases WORD,...] [--all]

``PATH`` is a checkout of aallam/execbox (1fa0edc), prepared as ``execbox_host.py`` does.
Exits 1 if any case differs. Every wait is bounded; only processes started here are stopped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from benchkit.processes import start_daemon
from differential_corpus import Case, corpus
from execbox_host import free_port, prepare, start_reference

RUN_S: Final = 600.0  # the whole corpus on one runner (the timeout cases wait ~0.3 s each)


def outcomes(execbox: Path, url: str, corpus_file: Path) -> dict[str, dict[str, Any]]:
    """Each case's outcome on the runner at ``url``, by case name."""
    completed = subprocess.run(
        [
            str(execbox / "node_modules" / ".bin" / "tsx"),
            "execbox-runner-harness/differential.ts",
            url,
            str(corpus_file),
        ],
        cwd=execbox,
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=True,
    )
    lines = [json.loads(line) for line in completed.stdout.split("\n") if line.startswith("{")]
    return {line.pop("name"): line for line in lines}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execbox", type=Path, required=True, help="a checkout of aallam/execbox (1fa0edc)")
    parser.add_argument("--cases", default="", help="only the cases whose names contain one of these (comma-separated)")
    parser.add_argument("--all", action="store_true", help="print every case, not only those that differ")
    args = parser.parse_args()
    execbox = args.execbox.resolve()
    prepare(execbox)
    words = [w for w in args.cases.split(",") if w]
    cases: list[Case] = [c for c in corpus() if not words or any(w in c["name"] for w in words)]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as corpus_file:
        json.dump(cases, corpus_file)
        corpus_file.flush()
        ours = start_daemon(warm_workers=None)
        try:
            reference = start_reference(execbox, port := free_port())
            try:
                theirs = outcomes(execbox, f"ws://127.0.0.1:{port}/", Path(corpus_file.name))
            finally:
                reference.stop()
            mine = outcomes(execbox, ours.url, Path(corpus_file.name))
        finally:
            ours.stop()
    differing = 0
    for c in cases:
        name = c["name"]
        same = mine.get(name) == theirs.get(name)
        differing += not same
        if args.all or not same:
            print(f"{'same' if same else 'DIFFERS'} {name}: {c['code']!r}")
            print(f"  ours      {json.dumps(mine.get(name))[:400]}")
            if not same:
                print(f"  reference {json.dumps(theirs.get(name))[:400]}")
    print(f"{differing} of {len(cases)} cases differ")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
