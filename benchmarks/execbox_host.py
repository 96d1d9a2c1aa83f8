"""Side by side with the reference runner, through execbox's own TypeScript host.

execbox's ``RemoteExecutor`` over a ``ws`` transport (``execbox_host/wsTransport.ts``)
drives this daemon and, alternated with it, execbox's reference QuickJS remote
endpoint behind a ``ws`` server (``execbox_host/refServer.ts``), both on 127.0.0.1.
Per round and runner it prints what ``execbox_host/bench.ts`` measured and the CPU the
runner's process tree spent meanwhile. The sections:

* ``a``: 1,000 executions awaiting a 2 s tool;
* ``b``: median latency, one execution at a time, with 0, 1 and 10 sequential tool
  calls and 10 parallel ones (``Promise.all``);
* ``c``, ``c1``, ``c10``, ``cp10``: ``1+1``, 1 tool call, 10 sequential, 10 parallel
  at ``--concurrency`` (64) for 5 s. Each runs in a ``bench.ts`` run of its own, so
  its line gives the runner's CPU per execution for that workload alone; the last
  lines give each workload's ratio of this daemon's CPU per execution to the
  reference's (median over rounds).

``--floor`` adds, per round, ``b``'s ``1+1`` latency against the floor server
(``benchkit.floor_server``: this daemon's socket path answering ``done`` at once,
nothing run): what the host itself and the connection cost, below any runner.
``--suites`` first runs execbox's executor contract suite and wrapped-MCP
penetration suite against this daemon (vitest).

    python benchmarks/execbox_host.py --execbox PATH [--rounds 3] [--sections a,b,c,c1,c10,cp10]
                                      [--concurrency 64] [--floor] [--suites]

``PATH`` is a checkout of aallam/execbox (1fa0edc, the last commit with its remote
package): its packages are not on the npm registry, so the harness runs inside the
checkout, from ``PATH/execbox-runner-harness/`` (copied there). Without
``node_modules`` it runs ``npm ci`` and ``npm run build`` there first. Every wait is
bounded; only processes started here are stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
from pathlib import Path
from typing import Any, Final

from benchkit.floor_server import LISTENING
from benchkit.processes import Server, popen_module, start_daemon, start_server
from benchkit.procfs import tree_cpu_seconds

HARNESS: Final = Path(__file__).resolve().parent / "execbox_host"
INSTALL_S: Final = 900.0  # npm ci, npm run build
SUITES_S: Final = 300.0
ROUND_S: Final = 180.0  # one bench.ts run (a: ~4 s; b: up to 24 s; a c section: 5 s)
LOAD_SECTIONS: Final = ("c", "c1", "c10", "cp10")
WORKLOADS: Final = {"c": "1+1", "c1": "1 tool call", "c10": "10 sequential", "cp10": "10 parallel"}


def prepare(execbox: Path) -> Path:
    """The harness copied into the checkout (installed and built first if it is not); its directory there."""
    if not (execbox / "packages" / "remote").is_dir():
        raise SystemExit(f"{execbox}: not an execbox checkout with its remote package (1fa0edc)")
    if not (execbox / "node_modules").is_dir():
        for command in (["npm", "ci"], ["npm", "run", "build"]):
            subprocess.run(command, cwd=execbox, check=True, timeout=INSTALL_S)
    if not (execbox / "node_modules" / "ws").is_dir():  # the harness's WebSocket library; execbox has none
        subprocess.run(["npm", "install", "--no-save", "ws@8"], cwd=execbox, check=True, timeout=INSTALL_S)
    target = execbox / "execbox-runner-harness"
    target.mkdir(exist_ok=True)
    for source in HARNESS.glob("*.ts"):
        shutil.copy(source, target / source.name)
    return target


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_reference(execbox: Path, port: int) -> Server:
    """execbox's reference endpoint on ``port``, once it says it listens."""
    tsx = str(execbox / "node_modules" / ".bin" / "tsx")
    environment = {**os.environ, "PORT": str(port)}
    process = subprocess.Popen(
        [tsx, "execbox-runner-harness/refServer.ts"], cwd=execbox, stdout=subprocess.PIPE, text=True, env=environment
    )
    return start_server(process, "listening on")


def suites(execbox: Path, url: str) -> str:
    """The contract and penetration suites against ``url``: vitest's summary line."""
    completed = subprocess.run(
        [
            str(execbox / "node_modules" / ".bin" / "vitest"),
            "run",
            "--config",
            "execbox-runner-harness/vitest.config.ts",
        ],
        cwd=execbox,
        capture_output=True,
        text=True,
        timeout=SUITES_S,
        env={**os.environ, "RUNNER_URL": url},
        check=False,
    )
    summary = [line.strip() for line in completed.stdout.splitlines() if line.strip().startswith("Tests")]
    return summary[-1] if summary else f"vitest exited {completed.returncode}: {completed.stdout[-500:]}"


def bench(
    execbox: Path, url: str, sections: str, label: str, root: int, concurrency: int
) -> tuple[dict[str, Any], float]:
    """One ``bench.ts`` run against ``url``; its figures and the CPU seconds of ``root``'s process tree
    meanwhile, ``root`` included: this daemon's own process spends about half of its tree's CPU,
    where the reference's root is the ``tsx`` launcher of its server."""
    own, descendants, _ = tree_cpu_seconds(root)
    before = own + descendants
    harness = "execbox-runner-harness/bench.ts"
    completed = subprocess.run(
        [str(execbox / "node_modules" / ".bin" / "tsx"), harness, url, sections, label, str(concurrency)],
        cwd=execbox,
        capture_output=True,
        text=True,
        timeout=ROUND_S,
        check=True,
    )
    own, descendants, _ = tree_cpu_seconds(root)
    return json.loads(completed.stdout.strip().splitlines()[-1]), own + descendants - before


def report(label: str, figures: dict[str, Any], cpu: float) -> None:
    """One line: the runner's CPU and the run's figures, section by section."""
    parts = [f"{label:10s} runner CPU {cpu:5.2f} s"]
    if "a" in figures:
        a = figures["a"]
        parts.append(
            f"1,000 awaiting a 2 s tool: {a['wall_ms'] / 1000:.2f} s, failures {a['failures']},"
            f" host CPU {a['host_cpu_ms'] / 1000:.2f} s"
        )
    if "b" in figures:
        b = figures["b"]
        names = [n for n in ("0", "1", "10", "p10") if n in b]
        medians = " / ".join(f"{b[n]['p50_ms']:.2f}" for n in names)
        failures = sum(b[n]["fails"] for n in names)
        workloads = "1+1" if names == ["0"] else "0/1/10/10 parallel tools"
        parts.append(f"latency {workloads} {medians} ms, failures {failures}")
    for section in LOAD_SECTIONS:
        if section in figures:
            c = figures[section]
            parts.append(
                f"{WORKLOADS[section]} at c={c['concurrency']}: {c['per_s']}/s p50 {c['p50_ms']} ms"
                f" p99 {c['p99_ms']} ms, failures {c['fails']},"
                f" runner CPU {cpu * 1e6 / figures['executions']:,.0f} us per execution"
            )
    print("  " + "; ".join(parts), flush=True)


def runs(sections: list[str]) -> list[str]:
    """The ``bench.ts`` runs a round makes: ``a`` and ``b`` together, each load section alone."""
    rest = [s for s in sections if s not in LOAD_SECTIONS]
    return ([",".join(rest)] if rest else []) + [s for s in sections if s in LOAD_SECTIONS]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execbox", type=Path, required=True, help="a checkout of aallam/execbox (1fa0edc)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--sections", default="a,b,c,c1,c10,cp10", help="of bench.ts: a, b, c, c1, c10, cp10 (comma-separated)"
    )
    parser.add_argument("--concurrency", type=int, default=64, help="of the c sections")
    parser.add_argument("--floor", action="store_true", help="each round, 1+1 latency against the floor server")
    parser.add_argument("--suites", action="store_true", help="first run execbox's contract and penetration suites")
    args = parser.parse_args()
    execbox = args.execbox.resolve()
    prepare(execbox)
    ours = start_daemon(warm_workers=None)
    try:
        reference = start_reference(execbox, port := free_port())
        try:
            if args.suites:
                print(f"execbox's contract + penetration suites against this daemon: {suites(execbox, ours.url)}")
            runners = [
                ("ours", ours.url, ours.process.pid),
                ("reference", f"ws://127.0.0.1:{port}/", reference.process.pid),
            ]
            per_execution: dict[tuple[str, str], list[float]] = {}
            for index in range(1, args.rounds + 1):
                print(f"round {index}")
                if args.floor:
                    floor = start_server(popen_module("floor_server", stdin=subprocess.PIPE), LISTENING)
                    try:
                        report("floor", *bench(execbox, floor.url, "b0", "floor", floor.process.pid, 1))
                    finally:
                        floor.stop()
                for sections in runs(args.sections.split(",")):
                    for name, url, pid in runners:
                        figures, cpu = bench(execbox, url, sections, name, pid, args.concurrency)
                        report(name, figures, cpu)
                        if sections in LOAD_SECTIONS:
                            per_execution.setdefault((sections, name), []).append(cpu / figures["executions"])
                runners.reverse()  # alternate which runner goes first
            for section in LOAD_SECTIONS:
                if (section, "ours") in per_execution:
                    ours_cpu = statistics.median(per_execution[section, "ours"])
                    reference_cpu = statistics.median(per_execution[section, "reference"])
                    print(
                        f"{WORKLOADS[section]} at c={args.concurrency}: runner CPU per execution"
                        f" {ours_cpu * 1e6:,.0f} us against the reference's {reference_cpu * 1e6:,.0f} us,"
                        f" ratio {ours_cpu / reference_cpu:.2f}"
                    )
        finally:
            reference.stop()
    finally:
        ours.stop()


if __name__ == "__main__":
    main()
