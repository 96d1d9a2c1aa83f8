"""The daemon's memory budget holds while guests run: past it, the execution with the largest
heap ends with ``memory_limit``, and the daemon and its other executions live on (issue 9, item 5).
A real daemon with a small budget, a real guest that grows within its own limit."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import InvalidStatus

from execbox_runner.worker.failure import BUDGET_MESSAGE

from .daemonkit import client, execute, receive, run_to_done, running_daemon

BUDGET = 300 << 20  # the idle daemon tree holds about 90 MiB
# Grows by 4 MiB at a time, slowly enough for the daemon's sampling to see it, towards 480 MiB:
# within its own memoryLimitBytes (512 MiB), far past what the budget leaves it.
GROWER = """
const kept = [];
for (let i = 0; i < 120; i++) {
  kept.push(new Uint8Array(4 << 20).fill(i));
  const until = Date.now() + 10;
  while (Date.now() < until) {}
}
kept.length
"""
WAIT_S = 30.0


def test_past_the_budget_the_largest_execution_ends_with_memory_limit_and_the_others_live() -> None:
    with running_daemon("--memory-budget-bytes", str(BUDGET), "--warm-workers", "1") as d:
        with client(d.url) as parked, client(d.url) as grower:
            parked.send(execute("parked", "const v = await tools.echo(41); v + 1", timeoutMs=60_000))
            assert receive(parked)["type"] == "started"
            call = receive(parked)
            assert call["type"] == "tool_call"
            grower.send(execute("grower", GROWER, timeoutMs=60_000, memoryLimitBytes=512 << 20))
            assert receive(grower)["type"] == "started"
            done = receive(grower, timeout=WAIT_S)
            assert done["type"] == "done" and done["error"] == {"code": "memory_limit", "message": BUDGET_MESSAGE}
            # The parked neighbour lives, and resumes.
            parked.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 41}))
            resumed = receive(parked)
            assert resumed["type"] == "done" and resumed["ok"] and resumed["result"] == 42
        lines = d.json_lines(
            until=lambda lines: any(line["message"].startswith("memory budget spent") for line in lines)
        )
        (evicted,) = [line for line in lines if line["message"].startswith("memory budget spent")]
        assert not [line for line in lines if line["message"].startswith("memory budget too small")]
        assert evicted["level"] == "warning" and evicted["evicted_heap_bytes"] > 64 << 20
        # The memory came back: a new session is admitted, and runs.
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                with client(d.url) as ws:
                    assert run_to_done(ws, "after", "1 + 1")["result"] == 2
                break
            except Exception:  # 503 memory while the freed pages are still counted
                time.sleep(0.2)
        else:
            raise AssertionError("no session admitted after the eviction")


def test_within_the_budget_a_large_guest_ends_only_by_its_own_limit() -> None:
    """The budget is not a second, smaller limit: a guest that fits it keeps growing to its own."""
    with running_daemon("--memory-budget-bytes", str(2 << 30), "--warm-workers", "1") as d:
        with client(d.url) as ws:
            done = run_to_done(ws, "big", GROWER, timeoutMs=60_000, memoryLimitBytes=512 << 20)
        assert done["ok"] and done["result"] == 120, done
        lines = d.json_lines(until=lambda lines: any(line.get("execution_id") == "big" for line in lines))
        assert [line["outcome"] for line in lines if line.get("execution_id") == "big"] == ["ok"]
        assert not [line for line in lines if line["message"].startswith("memory budget spent")]


def test_a_budget_the_idle_daemon_already_spends_is_a_warning_at_start() -> None:
    """A budget below what the daemon and its warm workers hold at rest (1 MB: less than any Python
    process) refuses every session: the daemon says so once, at start, rather than only refusing."""
    with running_daemon("--memory-budget-bytes", str(1_000_000)) as d:
        with pytest.raises(InvalidStatus, match="503"), client(d.url):
            pass
        lines = d.json_lines(until=lambda lines: any(line.get("refusal") == "memory" for line in lines))
    (warned,) = [line for line in lines if line["message"].startswith("memory budget too small: ")]
    assert warned["level"] == "warning" and warned["memory_budget_bytes"] == 1_000_000
    assert warned["memory_used_bytes"] >= 900_000
    assert "every session will be refused (503 memory) until --memory-budget-bytes is raised" in warned["message"]
