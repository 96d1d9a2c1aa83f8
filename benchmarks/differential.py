"""This daemon against execbox's reference runner, case by case, through execbox's TypeScript host.

Runs every case of ``differential_corpus.py`` (guest code, the tools it may call and what each
answers, runtime options) through execbox's ``RemoteExecutor`` (``execbox_host/differential.ts``)
against this daemon and against the reference QuickJS endpoint, each case on a fresh connection,
and prints the cases whose outcomes differ, and in what: ``ok``, the result (its JSON and the type
the host got), the error's code, its message, the logs; then how many differ in each way. Nothing
run-dependent is in an outcome (no durations), so nothing is normalized. ``--all`` prints every
case's two outcomes; ``--cases`` runs only the cases whose names contain one of the given words.

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
from collections import Counter
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


def differing_parts(mine: dict[str, Any] | None, theirs: dict[str, Any] | None) -> list[str]:
    """What of two outcomes differs: ``ok``, ``result``, ``error.code``, ``error.message``, ``logs``
    (a runner that gave no outcome differs in ``all``)."""
    if mine is None or theirs is None:
        return [] if mine == theirs else ["all"]
    parts = [key for key in ("ok", "result", "logs") if mine.get(key) != theirs.get(key)]
    mine_error, their_error = mine.get("error") or {}, theirs.get("error") or {}
    parts += [f"error.{key}" for key in ("code", "message") if mine_error.get(key) != their_error.get(key)]
    return parts


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
    kinds: Counter[str] = Counter()
    for c in cases:
        name = c["name"]
        parts = differing_parts(mine.get(name), theirs.get(name))
        kinds[", ".join(parts)] += bool(parts)
        if args.all or parts:
            print(f"{'DIFFERS in ' + ', '.join(parts) if parts else 'same'} {name}: {c['code']!r}")
            print(f"  ours      {json.dumps(mine.get(name))[:400]}")
            if parts:
                print(f"  reference {json.dumps(theirs.get(name))[:400]}")
    differing = sum(kinds.values())
    print(f"{differing} of {len(cases)} cases differ", end="")
    print(f": {'; '.join(f'{n} in {kind}' for kind, n in kinds.most_common() if n)}" if differing else "")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
