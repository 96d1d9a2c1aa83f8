"""N executions at once, each awaiting a tool that answers after a delay.

The workload of real hosts: most executions wait on slow tools. Starts the daemon with default
settings (plus any ``--daemon-arg``), runs the load client (at most ``--opening`` handshakes under
way at once, each tool call answered ``--delay`` seconds after it came) while sampling the RSS of
the daemon's whole process tree (daemon, zygote, workers) every 0.1 s, and prints: ok, refused
(HTTP 503) and failed executions, the wall time until the last ``done``, when the last one parked,
the peak RSS and the memory per parked execution (peak over the idle tree's, divided by N; and the
daemon process's own share), and the CPU of the daemon tree and of the client. And where the ramp's
CPU went (until every execution parked, before the first tool answer): the daemon's, the workers'
(zygote included), and that of the busiest worker thread, which runs the executions' starts one
after another; read once, just before the delay ends.

    python benchmarks/parked.py [--n 1000] [--delay 2.0] [--opening 256] [--daemon-arg=--flag ...]

Every wait is bounded: 60 s per wait on the daemon, the delay + 600 s for the whole run.
"""

from __future__ import annotations

import argparse
import time

from benchkit.load import ID, Spec, raise_nofile_limit
from benchkit.measure import run_load
from benchkit.processes import start_daemon
from benchkit.procfs import rss_bytes, tree_rss_bytes, tree_thread_cpu_ns
from benchkit.workload import OPTIONS, execute_message

CODE = "const r = await tools.echo({ n: 1 }); r.n + 1"
WAIT_S = 60.0
RAMP_READ_S = 0.3  # the ramp's CPU is read in the last this long before the delay ends


def ramp_line(root: int, before: dict[tuple[int, int], int], after: dict[tuple[int, int], int], n: int) -> str:
    """The ramp's CPU per execution: the daemon's, the workers', their busiest thread's."""
    spent = {key: ns - before.get(key, 0) for key, ns in after.items()}
    daemon = sum(ns for (pid, _), ns in spent.items() if pid == root)
    workers = [ns for (pid, _), ns in spent.items() if pid != root]
    per = max(n, 1) * 1000
    return (
        f"  the ramp's CPU per execution: daemon {daemon / per:.0f} us, workers {sum(workers) / per:.0f} us"
        f" (their busiest thread {max(workers, default=0) / per:.0f} us)"
    )


def measure(url: str, root: int, n: int, delay: float, opening: int) -> None:
    """One run of ``n`` parked executions; its figures on stdout."""
    idle, daemon_idle = tree_rss_bytes(root), rss_bytes(root)
    peaks = [idle, daemon_idle]

    ramp: list[dict[tuple[int, int], int]] = []
    began = time.monotonic()  # the client starts after this: each tool answer comes later than delay from here

    def sample() -> None:
        peaks[0] = max(peaks[0], tree_rss_bytes(root))
        peaks[1] = max(peaks[1], rss_bytes(root))
        if not ramp and time.monotonic() - began >= delay - RAMP_READ_S:
            ramp.append(tree_thread_cpu_ns(root))

    options = OPTIONS | {"timeoutMs": int(1000 * (delay + WAIT_S))}  # room for the tool's delay
    execute = execute_message(ID, CODE, options).decode()
    load = Spec(url, execute, 2, n, n=n, opening=opening, delay=delay, wait_s=WAIT_S, limit_s=delay + 600)
    before = tree_thread_cpu_ns(root)
    result = run_load(load, root, sample)
    per, mib = max(n, 1), 2**20
    wall = result["last_done_s"] or result["elapsed_s"]
    print(f"executions: {n}, tool delay {delay:g} s, at most {opening} handshakes at a time")
    print(f"  ok {result['ok']}, refused (503) {result['refused']}, failed {result['failed']}")
    for reason, count in result["failure_reasons"].items():
        print(f"    failure ({count}x): {reason}")
    print(f"  wall time until the last done: {wall:.2f} s ({wall - delay:.2f} s beyond the tool delay)")
    print(f"  {result['parked']} of {n} parked (tool_call received), the last after {result['last_parked_s']:.2f} s")
    if ramp and result["last_parked_s"] < delay - 2 * RAMP_READ_S:
        print(ramp_line(root, before, ramp[0], n))
    else:
        print("  the ramp's CPU: not read (the ramp was not over well before the delay ended)")
    print(f"  CPU of the load client: {result['cpu_s']:.2f} s ({result['cpu_s'] / per * 1000:.2f} ms per execution)")
    print(f"  daemon tree: idle RSS {idle / mib:.0f} MiB, peak RSS {peaks[0] / mib:.0f} MiB")
    print(
        f"  memory per parked execution: {(peaks[0] - idle) / per / mib:.3f} MiB,"
        f" of which the daemon process {(peaks[1] - daemon_idle) / per / 2**10:.1f} KiB"
    )
    tree, daemon = result["server_cpu_s"] + result["workers_cpu_s"], result["server_cpu_s"]
    print(f"  CPU of the daemon tree: {tree:.2f} s ({tree / per * 1000:.2f} ms per execution)")
    print(f"  of which the daemon process: {daemon:.2f} s ({daemon / per * 1000:.2f} ms per execution)")
    print(
        f"  machine busy {result['machine_busy_pct']:.0f}% over {result['wall_s']:.2f} s; other processes"
        f" {result['other_pct']:.0f}% (RSS sampling {result['sampler_cpu_s']:.2f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--delay", type=float, default=2.0, help="seconds before a tool call is answered")
    parser.add_argument("--opening", type=int, default=256, help="handshakes under way at once")
    parser.add_argument("--daemon-arg", action="append", default=[], help="passed to `serve` (repeatable)")
    args = parser.parse_args()
    raise_nofile_limit()  # for the daemon started here, which holds the other end of every connection
    daemon = start_daemon(extra_args=args.daemon_arg)
    try:
        time.sleep(1.0)  # let the warm workers settle before measuring the idle tree
        measure(daemon.url, daemon.process.pid, args.n, args.delay, args.opening)
    finally:
        daemon.stop()


if __name__ == "__main__":
    main()
