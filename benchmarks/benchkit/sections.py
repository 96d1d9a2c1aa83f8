"""The measured sections, each measuring, reporting its lines and figures, and returning its failure count.

Numbered as in the report: 1-3 latency, marginal tool call and baselines
(measured together), 4 throughput, 5 the CPU-bound guest.
"""

from __future__ import annotations

from typing import Any, Final

from websockets.uri import WebSocketURI

from .baselines import bare_connect_echo_close_once, bare_echo_once
from .client import BlockingClient, execute_once, measure_executions
from .procfs import wait_pool_settled
from .report import Report, latency_line, throughput_line, verdict
from .settings import Settings
from .stats import LatencyStats, number
from .throughput import run_throughput
from .workload import (
    ALLOC_CODE,
    ALLOC_RESULT,
    CPU_CODE,
    CPU_RESULT,
    THROUGHPUT_CODE,
    execute_message,
    tool_code,
    tool_result,
    tool_sum,
)

TARGET_EXEC_VS_BARE: Final = 1.6
TARGET_TOOL_VS_ECHO: Final = 3.0
TARGET_THROUGHPUT: Final = 1500.0
TOOL_COUNTS: Final = (0, 1, 10)
ECHOES_PER_ROUND: Final = 5


def _interleaved(
    uri: WebSocketURI, echo_uri: WebSocketURI, iterations: int
) -> tuple[dict[int, LatencyStats], LatencyStats, LatencyStats, int]:
    """Latencies for each of ``TOOL_COUNTS``, bare connect+echo+close, bare echo; and the warm-up's failures.

    Measured round by round (0, 1, 10 tools in rotating order, bare connect,
    5 bare echoes) so that drifting background load on a shared machine hits
    them all alike.
    """
    warm = LatencyStats("warmup")
    for i in range(max(5, iterations // 10)):
        execute_once(uri, warm, f"warmup-{i}", tool_code(1), tool_sum(1))
        bare_connect_echo_close_once(echo_uri, warm, b"warm")
    lat = {n: LatencyStats(f"{n} tool calls") for n in TOOL_COUNTS}
    bare_close = LatencyStats("bare connect+echo+close")
    bare_rtt = LatencyStats("bare echo round trip")
    bare_payload = execute_message("bare", tool_code(0))  # the size of a real execute
    rtt_payload = tool_result({"callId": "call-1", "input": {"i": 1}})  # the size of a real tool_result
    rtt_client = BlockingClient(echo_uri)
    rtt_texts = rtt_client.texts()
    for i in range(iterations):
        shift = i % len(TOOL_COUNTS)
        for n in TOOL_COUNTS[shift:] + TOOL_COUNTS[:shift]:
            execute_once(uri, lat[n], f"lat{n}-{i}", tool_code(n), tool_sum(n))
        bare_connect_echo_close_once(echo_uri, bare_close, bare_payload)
        for _ in range(ECHOES_PER_ROUND):
            bare_echo_once(rtt_client, rtt_texts, bare_rtt, rtt_payload)
    rtt_client.close()
    return lat, bare_close, bare_rtt, warm.failures


def latency_section(uri: WebSocketURI, echo_uri: WebSocketURI, iterations: int, report: Report) -> int:
    """Sections 1-3: fresh-connection latencies, marginal tool call, echo baselines and the target ratios."""
    lat, bare_close, bare_rtt, warm_failures = _interleaved(uri, echo_uri, iterations)
    say, summary = report.say, report.summary

    say("\n1. Latency of a full execution, fresh connection each (connect, execute, tools, done, close)")
    for stats in lat.values():
        say(latency_line(stats))
    summary["latency"] = {str(n): s.summary() for n, s in lat.items()}

    say("\n2. Marginal cost per tool call")
    marginal = (lat[10].median - lat[0].median) / 10
    say(f"  (median(10 tools) - median(0 tools)) / 10 = {marginal:.3f} ms")
    summary["marginal_tool_call_ms"] = number(marginal)

    say("\n3. Baselines: bare WebSocket echo server (Sans-I/O ServerProtocol over trio, own process)")
    say(latency_line(bare_close))
    say(latency_line(bare_rtt))
    summary["baseline"] = {"connect_echo_close": bare_close.summary(), "echo_round_trip": bare_rtt.summary()}
    ratio_exec = lat[0].median / bare_close.median
    ratio_tool = marginal / bare_rtt.median
    say(
        f"  0-tool execution / bare connect+echo+close = {ratio_exec:5.2f}x  (target <= {TARGET_EXEC_VS_BARE}x: {verdict(ratio_exec <= TARGET_EXEC_VS_BARE)})"
    )
    say(
        f"  marginal tool call / bare echo round trip  = {ratio_tool:5.2f}x  (target <= {TARGET_TOOL_VS_ECHO}x: {verdict(ratio_tool <= TARGET_TOOL_VS_ECHO)})"
    )
    summary["ratios"] = {
        "exec0_vs_bare_connect_echo_close": number(ratio_exec, 3),
        "exec0_target": TARGET_EXEC_VS_BARE,
        "exec0_met": ratio_exec <= TARGET_EXEC_VS_BARE,
        "tool_vs_bare_echo_rtt": number(ratio_tool, 3),
        "tool_target": TARGET_TOOL_VS_ECHO,
        "tool_met": ratio_tool <= TARGET_TOOL_VS_ECHO,
    }
    return warm_failures + sum(s.failures for s in (*lat.values(), bare_close, bare_rtt))


def throughput_section(url: str, settings: Settings, daemon_pid: int | None, report: Report) -> int:
    """Section 4: executions/s at each concurrency, after a warm-up at the highest (where the pool grows)."""
    duration, levels = settings.duration, settings.levels
    report.say(f"\n4. Throughput ({THROUGHPUT_CODE!r}, fresh connection per execution, {duration:g} s per level)")

    def level_run(level: int, seconds: float) -> dict[str, Any]:
        procs = settings.client_procs if level >= 16 else 1
        return run_throughput(url, settings.load_client, level, seconds, procs, THROUGHPUT_CODE, daemon_pid)

    top = max(levels)
    warm = level_run(top, max(1.0, duration / 2))
    report.say(
        f"  warm-up at c={top} (includes the worker pool growing): {warm['executions_per_s']} exec/s, "
        f"{warm['failures']} failures, {warm.get('live_workers_after', '?')} live workers after"
    )
    if daemon_pid:
        waited, workers = wait_pool_settled(daemon_pid)
        report.say(f"  worker pool settled at {workers} processes {waited:.1f} s after the warm-up")
        warm["pool_settle_wait_s"], warm["pool_workers"] = round(waited, 2), workers
    report.summary["throughput_warmup"] = warm
    results = [level_run(level, duration) for level in levels]
    for result in results:
        report.say(throughput_line(result))
    report.summary["throughput"] = results
    at_64 = next((r for r in results if r["concurrency"] == 64), None)
    if at_64 is not None:
        met = at_64["executions_per_s"] >= TARGET_THROUGHPUT
        report.say(
            f"  throughput at c=64 = {at_64['executions_per_s']} exec/s  (target >= {TARGET_THROUGHPUT:g}: {verdict(met)})"
        )
        report.summary["throughput_target_met"] = met
    return sum(r["failures"] for r in results)


def cpu_section(uri: WebSocketURI, iterations: int, report: Report) -> int:
    """Section 5: median latency of CPU-bound guests, where the engine, not the plumbing, dominates:
    a loop, and an allocation-heavy guest."""
    report.say(f"\n5. CPU-bound guests: a loop ({CPU_CODE}); 100,000 small objects built, sorted, serialized")
    failures = 0
    for key, label, code, result in (
        ("cpu_bound", "cpu-bound loop", CPU_CODE, CPU_RESULT),
        ("allocation_heavy", "allocation-heavy", ALLOC_CODE, ALLOC_RESULT),
    ):
        stats = measure_executions(uri, label, code, iterations, result)
        report.say(latency_line(stats))
        report.summary[key] = stats.summary()
        failures += stats.failures
    return failures
