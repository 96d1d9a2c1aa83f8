"""The parked workload (executions awaiting a tool that answers after a delay) and what its clients count.

Both parked clients (``raw`` and ``websockets``) send these messages and keep
this tally, so their figures compare.
"""

from __future__ import annotations

import json
import resource
import time
from collections import Counter
from typing import Any, Final

from .workload import OPTIONS, execute_message, providers

CODE: Final = "const r = await tools.slow({}); r + 1"
PROVIDERS: Final = providers("slow")
WAIT_S: Final = 60.0  # any one wait on the daemon: handshake, tool_call, done, closing handshake
RUN_S: Final = 600.0  # the whole run, beyond the tool delay
FAILURE_REASONS: Final = 5


def raise_nofile_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: 10,000 connections need 10,000 descriptors."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def execute(index: int, delay: float) -> bytes:
    """Execution ``index``'s ``execute``; its ``timeoutMs`` leaves room for the tool delay."""
    options = OPTIONS | {"timeoutMs": max(60_000, int(1000 * (delay + WAIT_S)))}
    return execute_message(f"e{index}", CODE, options, PROVIDERS)


def answer(call: dict[str, Any], index: int) -> bytes:
    """The ``tool_result`` for execution ``index``'s ``tool_call``: ok, result ``index``."""
    return json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": index}).encode()


class ParkedTally:
    """Outcomes and times (seconds since the tally began) of one client's executions, and its own CPU."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.began = time.monotonic()
        self.cpu0 = time.process_time()
        self.ok = 0
        self.refused = 0
        self.failures: Counter[str] = Counter()
        self.parked_s: list[float] = []  # when each tool_call arrived
        self.finished_s: list[float] = []  # when each done arrived

    def parked(self) -> None:
        self.parked_s.append(time.monotonic() - self.began)

    def done(self, message: dict[str, Any], index: int) -> str:
        """Note a ``done``; "" if it is ok with the expected result, else what is wrong with it."""
        self.finished_s.append(time.monotonic() - self.began)
        if message.get("ok") is True and message.get("result") == index + 1:
            return ""
        return f"done not ok: {str(message.get('error', message.get('result')))[:80]}"

    def end(self, outcome: str, status: int) -> None:
        """One session over: ``outcome`` "" for success, else what went wrong; ``status`` its handshake's HTTP status."""
        if not outcome:
            self.ok += 1
        elif status == 503:
            self.refused += 1
        else:
            self.failures[outcome] += 1

    def result(self) -> dict[str, Any]:
        """JSON-ready figures; sessions never ended count as failures."""
        unended = self.n - self.ok - self.refused - self.failures.total()
        if unended > 0:
            self.failures["unended at the run's time limit"] += unended
        return {
            "ok": self.ok,
            "refused": self.refused,
            "failed": self.failures.total(),
            "failure_reasons": dict(self.failures.most_common(FAILURE_REASONS)),
            "parked_s": self.parked_s,
            "finished_s": self.finished_s,
            "cpu_s": time.process_time() - self.cpu0,
            "elapsed_s": time.monotonic() - self.began,
        }
