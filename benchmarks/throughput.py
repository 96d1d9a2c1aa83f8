"""CPU per execution under load, a fresh connection per execution: servers and workloads compared.

Each side is a server started here (by default one: the daemon with default settings, plus any
``--daemon-arg``), warmed up at the highest concurrency until its worker pool settles. In each of
``--rounds`` rounds every side runs every workload at every concurrency for ``--duration`` seconds
with the load client (every ``tool_call`` answered at once with its input), the sides' and the
workloads' order reversed every other round so that a drift of the machine's load falls on all
alike. It prints every run, then each side's, workload's and concurrency's medians over the rounds:
executions per second (and against the first side's), latency, and the CPU per execution of the
server process, its workers and the whole tree. And:

  --tools        the workloads 0, 1 and 10 sequential tool calls and 10 in parallel instead of
                 ``1+1``, and what a tool call adds: the first, each further sequential one, each
                 of ten parallel ones;
  --cpus L ...   a side per CPU list, the daemon pinned to it with ``taskset -c L``;
  --other PATH   this checkout's daemon against that checkout's (with ``--other-pythonpath DIR``
                 first on its path: a QuickJS build of ``deploy/quickjs/build.py --target``), and
                 the pairs compared one by one: a change of a few percent shows in how many pairs
                 it is lower sooner than in the medians, which the hour moves by twenty;
  --floor        the floor server (``benchkit.floor_server``: the daemon's own socket path
                 answering every ``execute`` with nothing behind it) beside the daemon, and the
                 CPU of a bare QuickJS context made and freed: the floor plus the context is the
                 least the tree can spend; with ``--other``, this floor server against that one.

    python benchmarks/throughput.py [--tools] [--cpus 0 0,1 | --other PATH [--floor] | --floor]
        [--concurrency 64] [--duration 4] [--rounds 3] [--daemon-arg=...]

It asserts nothing about time; every wait is bounded.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import quickjs
from benchkit.floor_server import LISTENING
from benchkit.measure import line, throughput, warm_up
from benchkit.pairs import summary
from benchkit.processes import Server, popen_module, start_daemon, start_server
from benchkit.workload import THROUGHPUT_CODE, tool_code

PARALLEL = (
    "const r = await Promise.all(Array.from({length: 10}, (_, i) => tools.echo({i}))); r.reduce((n, x) => n + x.i, 0)"
)
TOOLS = {"0 tools": (tool_code(0), 0), "1 tool": (tool_code(1), 0), "10 sequential": (tool_code(10), 45)}
TOOLS["10 parallel"] = (PARALLEL, 45)
CONTEXTS = 2000  # contexts made and freed for the QuickJS figure


def sides(args: argparse.Namespace) -> dict[str, Callable[[], Server]]:
    """How to start each side's server."""
    daemon = partial(start_daemon, extra_args=args.daemon_arg)

    def floor(checkout: Path | None = None) -> Server:
        return start_server(popen_module("floor_server", stdin=subprocess.PIPE, checkout=checkout), LISTENING)

    if args.cpus:
        return {f"cpus {cpus}": partial(daemon, prefix=["taskset", "-c", cpus]) for cpus in args.cpus}
    if args.other and args.floor:
        return {"this": floor, "other": partial(floor, args.other.resolve())}
    if args.other:
        return {
            "this": daemon,
            "other": partial(daemon, checkout=args.other.resolve(), pythonpath=args.other_pythonpath),
        }
    return {"floor": floor, "daemon": daemon} if args.floor else {"daemon": daemon}


def context_us() -> float:
    """CPU microseconds to make a bare QuickJS context (runtime and intrinsics) and free it."""
    quickjs.Context()
    cpu0 = time.process_time()
    for _ in range(CONTEXTS):
        quickjs.Context()
    return (time.process_time() - cpu0) / CONTEXTS * 1e6


def median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(run[key] for run in runs))


def report(results: dict[tuple[str, str, int], list[dict[str, Any]]], args: argparse.Namespace) -> None:
    """The medians, then what the options ask for."""
    print(f"medians over {args.rounds} rounds (CPU in us per execution):")
    print(
        f"  {'side':<12} {'workload':<14} {'c':>3} {'exec/s':>7} {'x':>5} {'ms':>7} {'server':>7} {'workers':>7} {'tree':>7}"
    )
    first = next(iter(results))[0]
    for (side, name, level), runs in results.items():
        rate = median(runs, "executions_per_s")
        ratio = rate / max(median(results[(first, name, level)], "executions_per_s"), 1e-9)
        figures = (median(runs, key) for key in ("latency_median_ms", "server_us", "workers_us", "tree_us"))
        print(
            f"  {side:<12} {name:<14} {level:>3} {rate:7.0f} {ratio:5.2f} "
            + "{:7.2f} {:7.0f} {:7.0f} {:7.0f}".format(*figures)
        )
    if args.tools:
        print("what a tool call adds to the tree (us): the first, each further sequential, each of 10 parallel")
        for side, level in dict.fromkeys((side, level) for side, _, level in results):
            zero, one, ten, parallel = (median(results[(side, name, level)], "tree_us") for name in TOOLS)
            print(f"  {side} c={level}: {one - zero:.0f}, {(ten - one) / 9:.0f}, {(parallel - zero) / 10:.0f}")
    if args.other:
        for name, level in dict.fromkeys((name, level) for _, name, level in results):
            print(f"tree us, {name}, c={level}:")
            print(
                "\n".join(
                    summary(
                        {side: [run["tree_us"] for run in results[(side, name, level)]] for side in ("this", "other")}
                    )
                )
            )
    elif args.floor:
        context = context_us()
        print(f"a bare QuickJS context made and freed: {context:.0f} us of CPU")
        for level in dict.fromkeys(level for _, _, level in results):
            floor, daemon = (results[(side, "1+1", level)] for side in ("floor", "daemon"))
            bare, real, tree = median(floor, "server_us"), median(daemon, "server_us"), median(daemon, "tree_us")
            print(
                f"  c={level}: floor {bare:.0f} us; the daemon {real:.0f} us, {real - bare:.0f} us ({real / bare:.2f}x) "
                f"above it; floor + context {bare + context:.0f} us against the tree's {tree:.0f} us"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", action="store_true", help="the tool-call workloads instead of 1+1")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--cpus", nargs="+", help="taskset CPU lists, a side each; the first is the base")
    group.add_argument("--other", type=Path, help="a checkout of another commit")
    parser.add_argument("--other-pythonpath", help="first on the other daemon's PYTHONPATH (a QuickJS build)")
    parser.add_argument("--floor", action="store_true", help="the floor server beside the daemon (or with --other)")
    parser.add_argument("--concurrency", default="64", help="comma-separated levels")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--daemon-arg", action="append", default=[], help="passed to `serve` (repeatable)")
    args = parser.parse_args()
    if args.floor and (args.tools or args.cpus):
        parser.error("the floor server answers every execute at once: not with --tools or --cpus")
    levels = [int(level) for level in args.concurrency.split(",")]
    workloads = TOOLS if args.tools else {"1+1": (THROUGHPUT_CODE, 2)}
    servers: dict[str, Server] = {}
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    try:
        for side, start in sides(args).items():
            servers[side] = start()
            warm_up(servers[side].url, servers[side].process.pid, max(levels))
        for index in range(args.rounds):
            print(f"round {index + 1}", flush=True)
            for side in list(servers) if index % 2 == 0 else list(servers)[::-1]:
                for name in list(workloads) if index % 2 == 0 else list(workloads)[::-1]:
                    for level in levels:
                        server = servers[side]
                        result = throughput(server.url, server.process.pid, level, args.duration, *workloads[name])
                        print(line(f"{side} {name}", result), flush=True)
                        results.setdefault((side, name, level), []).append(result)
    finally:
        for server in servers.values():
            server.stop()
    report(results, args)


if __name__ == "__main__":
    main()
