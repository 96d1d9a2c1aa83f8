#!/usr/bin/env python3
"""Loopback benchmark of the execbox runner daemon (the command; the work is in ``benchkit/``).

Measures, against a daemon this script starts (or ``--url`` of a running one):
1-3. latency of a full execution over a fresh WebSocket connection with 0, 1
     and 10 tool calls, the marginal cost of a tool call, and the same against
     a bare WebSocket echo server built like the daemon, with target ratios;
4.   throughput at several concurrencies, with where the CPU went;
5.   the median latency of a CPU-bound guest.

``--json`` prints a JSON summary on stdout (the report then goes to stderr).
See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import sys

from benchkit.load_client import MODES
from benchkit.run import run
from benchkit.settings import SECTIONS, Settings


def parse_args(argv: list[str] | None = None) -> Settings:
    """The command line as ``Settings``, with the ``--quick`` defaults applied."""
    parser = argparse.ArgumentParser(description="Loopback benchmark of the execbox runner daemon.")
    parser.add_argument("--url", help="benchmark a running daemon at this ws:// URL instead of starting one")
    parser.add_argument("--daemon-pid", type=int, help="with --url: the daemon's PID, for CPU accounting")
    parser.add_argument(
        "--json", action="store_true", help="print a JSON summary on stdout (the report goes to stderr)"
    )
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument("--iterations", type=int, help="executions per latency measurement (default 300; quick 30)")
    parser.add_argument("--duration", type=float, help="seconds per throughput level (default 4; quick 1)")
    parser.add_argument("--concurrency", default="1,16,64", help="throughput concurrency levels (default 1,16,64)")
    parser.add_argument(
        "--client-procs", type=int, default=1, help="load client processes for concurrency >= 16 (default 1)"
    )
    parser.add_argument(
        "--load-client",
        choices=MODES,
        default="raw",
        help="throughput client: raw = hand-rolled RFC 6455 on epoll (cheapest, default); "
        "sansio = websockets ClientProtocol over asyncio.Protocol",
    )
    parser.add_argument("--cpu-iterations", type=int, help="CPU-bound guest executions (default 10; quick 3)")
    parser.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help="comma-separated subset of latency (sections 1-3), throughput, cpu (default: all)",
    )
    parser.add_argument("--warm-workers", type=int, help="passed to the daemon as --warm-workers")
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="extra argument for the daemon (repeatable, e.g. --daemon-arg=--max-workers=8)",
    )
    args = parser.parse_args(argv)
    return Settings(
        iterations=args.iterations or (30 if args.quick else 300),
        duration=args.duration or (1.0 if args.quick else 4.0),
        cpu_iterations=args.cpu_iterations or (3 if args.quick else 10),
        levels=[int(c) for c in args.concurrency.split(",") if c.strip()],
        sections=frozenset(s.strip() for s in args.sections.split(",") if s.strip()),
        load_client=args.load_client,
        client_procs=args.client_procs,
        url=args.url,
        daemon_pid=args.daemon_pid,
        warm_workers=args.warm_workers,
        daemon_args=args.daemon_arg,
        json=args.json,
    )


if __name__ == "__main__":
    sys.exit(run(parse_args()))
