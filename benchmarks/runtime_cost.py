"""What a worker spends on one trivial execution's runtime, part by part, in this process.

Each figure is the least, over ``--chunks`` chunks of ``--size`` iterations, of the
wall time per iteration on this one thread: the chunk the machine disturbed least.
On this shared machine that moves by a few percent between runs, where a median
moves by twenty, so it shows a change of ~10 us to QuickJS or to the worker's
Python that ``worker_steady.py`` and the whole tree hide:

* a bare QuickJS context made and freed (``quickjs.Context()``);
* a fresh runtime made and freed, the bootstrap loaded (``fresh_runtime``);
* a trivial execution's whole ``GuestRun``: the runtime, the guest's ``1+1``
  normalized, evaluated and started, its outcome read, the runtime freed;
* the same for a guest making ten sequential tool calls, each settled at once (the
  engine's and ``GuestRun``'s part of a tool call, without the worker's loop, is a
  tenth of the difference);
* the guest's text normalized alone (tree-sitter), and a program as models write them in code
  mode (``benchkit.workload.MODEL_PROGRAM``): normalizing costs in proportion to the code's length;
* a fresh runtime freed alone (``JS_DiscardRuntime`` in the build).

With ``--other-pythonpath DIR --rounds N`` it runs itself N times with this
environment's QuickJS build and with the one in DIR (``deploy/quickjs/build.py
--target DIR`` with the edit to compare left out), alternated, and prints each
side's range per figure.

    python benchmarks/runtime_cost.py [--chunks 25] [--size 200] [--other-pythonpath DIR --rounds 5]

It asserts nothing about time.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import quickjs
from benchkit.pairs import build_options, measured_builds
from benchkit.workload import MODEL_PROGRAM, tool_code

from execbox_runner.protocol import ipc
from execbox_runner.worker.guest import GuestRun
from execbox_runner.worker.normalize import normalize
from execbox_runner.worker.runtime import Runtime, fresh_runtime

RUN = ipc.Run("1+1", 5.0, 64 << 20, 100, 64000, [("tools", ["echo"])], 1 << 24)
TOOLS_RUN = ipc.Run(tool_code(10), 5.0, 64 << 20, 100, 64000, RUN.providers, 1 << 24)
WARM_UP = 300  # iterations before the first chunk: the heap and caches settle


def least(work: Callable[[], object], chunks: int, size: int) -> float:
    """Microseconds per call of ``work``: the least of ``chunks`` chunks of ``size`` calls."""
    for _ in range(WARM_UP):
        work()
    best = float("inf")
    for _ in range(chunks):
        began = time.perf_counter()
        for _ in range(size):
            work()
        best = min(best, (time.perf_counter() - began) / size)
    return best * 1e6


def with_tools() -> ipc.Finished:
    """``TOOLS_RUN`` to its end, each tool call settled at once with its input."""
    guest = GuestRun(TOOLS_RUN, fresh_runtime())
    out = guest.start()
    while isinstance(out, ipc.ToolCalls):
        out = guest.settle(*(ipc.Settle(call, True, value) for call, _, _, value in out.calls))
    assert out.ok and out.result == b"45", out  # tool_code's sum of 0..9
    return out


def least_free(chunks: int, size: int) -> float:
    """Microseconds to free a fresh runtime: the least of ``chunks`` chunks, each freeing ``size``."""
    best = float("inf")
    for _ in range(chunks):
        runtimes: list[Runtime | None] = [fresh_runtime() for _ in range(size)]
        began = time.perf_counter()
        for index in range(size):
            runtimes[index] = None
        best = min(best, (time.perf_counter() - began) / size)
    return best * 1e6


def measure(chunks: int, size: int) -> dict[str, float]:
    return {
        "context made and freed": least(quickjs.Context, chunks, size),
        "runtime with the bootstrap, made and freed": least(fresh_runtime, chunks, size),
        "trivial execution (GuestRun, start to Finished)": least(
            lambda: GuestRun(RUN, fresh_runtime()).start(), chunks, size
        ),
        "ten sequential tool calls, each settled at once": least(with_tools, chunks, size),
        "the guest's text normalized": least(lambda: normalize(RUN.code), chunks, size),
        f"a {len(MODEL_PROGRAM)}-character program normalized": least(lambda: normalize(MODEL_PROGRAM), chunks, size),
        "a fresh runtime freed": least_free(chunks, size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=25)
    parser.add_argument("--size", type=int, default=200)
    build_options(parser, rounds=5)
    args = parser.parse_args()
    arguments = ["--chunks", str(args.chunks), "--size", str(args.size)]
    unit = f"us, the least of {args.chunks} chunks of {args.size}"
    measured_builds(args, __file__, arguments, unit, lambda: measure(args.chunks, args.size))


if __name__ == "__main__":
    main()
