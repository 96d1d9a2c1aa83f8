"""What heavier guests cost the engine itself: QuickJS builds compared on the language's work.

``runtime_cost.py`` measures a trivial execution, where making the runtime is most of the cost;
this measures guests that compute: each program below evaluated in a fresh context (1 GiB memory
limit), the least of ``--runs`` wall times in milliseconds, on this one thread. A QuickJS build
changes these (``deploy/quickjs/build.py``, compiled profile-guided or not), the daemon does not.
With ``--other-pythonpath DIR --rounds N`` it runs itself N times with this environment's QuickJS
build and with the one in DIR (``deploy/quickjs/build.py --no-pgo --target DIR``, say), alternated,
and prints each side's range per program.

    python benchmarks/guest_cost.py [--runs 5] [--other-pythonpath DIR --rounds 3]

It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import time
from typing import Final

import quickjs
from benchkit.pairs import build_options, measured_builds

MEMORY_LIMIT: Final = 1 << 30
# Language work a model's code does, each a few tens of milliseconds; some of it the build's
# training (deploy/quickjs/training.py) never runs in this form.
PROGRAMS: Final = {
    "a 3e6-iteration loop": "let s = 0; for (let i = 0; i < 3e6; i++) s += i % 7; s",
    "1e5 objects through JSON": "JSON.stringify(Array.from({ length: 1e5 }, (_, i) => ({ a: i, b: String(i) }))).length",
    "a global regex replace over 600 KB": "'abc'.repeat(2e5).replace(/b/g, 'x').length",
    "1e6 typed-array stores": "const a = new Float64Array(1e6); for (let i = 0; i < a.length; i++) a[i] = Math.sqrt(i); a[999]",
    "3,000 BigInt multiplications": "let x = 1n; for (let i = 0; i < 3000; i++) x *= 3n; x.toString().length",
    "5e5 class instances": (
        "class P { constructor(x, y) { this.x = x; this.y = y } add(o) { return new P(this.x + o.x, this.y + o.y) } }"
        " let p = new P(0, 0); for (let i = 0; i < 5e5; i++) p = p.add(new P(1, 2)); p.x"
    ),
    "sorting 2e5 numbers": "const a = []; for (let i = 0; i < 2e5; i++) a.push((i * 7919) % 100003); a.sort((x, y) => x - y); a[5]",
    "1e5 radix conversions and a split": "let t = ''; for (let i = 0; i < 1e5; i++) t += i.toString(36); t.split('a').length",
}


def least_ms(code: str, runs: int) -> float:
    """The least of ``runs`` wall times of ``code`` evaluated in a fresh context, in milliseconds."""
    best = float("inf")
    for _ in range(runs):
        context = quickjs.Context()
        context.set_memory_limit(MEMORY_LIMIT)
        began = time.perf_counter()
        context.eval(code)
        best = min(best, time.perf_counter() - began)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    build_options(parser, rounds=3)
    args = parser.parse_args()
    unit = f"ms, the least of {args.runs} runs"
    measured_builds(
        args,
        __file__,
        ["--runs", str(args.runs)],
        unit,
        lambda: {name: least_ms(code, args.runs) for name, code in PROGRAMS.items()},
    )


if __name__ == "__main__":
    main()
