"""Drive a ``GuestRun`` the way a worker does, answering tool calls with a host function."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from execbox_runner.protocol import ipc
from execbox_runner.worker.guest import GuestRun
from execbox_runner.worker.runtime import STACK_BYTES

Host = Callable[[str, str, Any], Any]
UNDEFINED = object()


class HostError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def echo_host(provider: str, tool: str, value: Any) -> Any:
    return value


def run_message(
    code: str,
    *,
    providers: list[tuple[str, list[str]]] | None = None,
    budget: float = 5.0,
    memory: int = 64 << 20,
) -> ipc.Run:
    """A ``Run`` as the daemon sends it, with small log limits, for tests that drive a guest or worker by hand."""
    return ipc.Run(
        code=code,
        budget_s=budget,
        memory_limit=memory,
        max_log_lines=10,
        max_log_chars=100,
        providers=providers or [],
        max_output_bytes=1 << 20,
    )


def run(
    code: str,
    *,
    host: Host = echo_host,
    providers: list[tuple[str, list[str]]] | None = None,
    memory: int = 64 << 20,
    budget: float = 5.0,
    lines: int = 100,
    chars: int = 64000,
    max_output: int = 16 << 20,
    record: list[tuple[str, str, Any]] | None = None,
) -> ipc.Finished:
    """Run guest code to completion; ``record`` collects (provider, tool, input) of each call.

    It runs on a thread with the real stack guest code gets in a worker (runtime.STACK_BYTES).
    """
    arguments = (code, host, providers, memory, budget, lines, chars, max_output, record)
    outcome: list[ipc.Finished | BaseException] = []

    def target() -> None:
        try:
            outcome.append(_run(*arguments))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    previous = threading.stack_size(STACK_BYTES)
    try:
        thread = threading.Thread(target=target)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _run(
    code: str,
    host: Host,
    providers: list[tuple[str, list[str]]] | None,
    memory: int,
    budget: float,
    lines: int,
    chars: int,
    max_output: int,
    record: list[tuple[str, str, Any]] | None,
) -> ipc.Finished:
    if providers is None:
        providers = [("tools", ["echo", "fail"])]
    guest = GuestRun(
        ipc.Run(
            code=code,
            budget_s=budget,
            memory_limit=memory,
            max_log_lines=lines,
            max_log_chars=chars,
            providers=providers,
            max_output_bytes=max_output,
        )
    )
    out = guest.start()
    logs: list[str] = []
    for _ in range(1000):
        logs += out.logs
        if record is not None:
            record += [
                (provider, tool, UNDEFINED if raw is None else json.loads(raw)) for _, provider, tool, raw in out.calls
            ]
        if isinstance(out, ipc.Finished):  # its calls are those the guest never awaited
            return ipc.Finished(
                ok=out.ok, result=out.result, code=out.code, message=out.message, logs=logs, calls=out.calls
            )
        assert out.calls, "guest stalled with no tool call pending"
        for call_id, provider, tool, raw in out.calls:
            value = UNDEFINED if raw is None else json.loads(raw)
            try:
                answer = host(provider, tool, value)
            except HostError as exc:
                out = guest.settle(ipc.Settle.reject(call_id, exc.code, exc.message))
            else:
                payload = None if answer is UNDEFINED else json.dumps(answer).encode()
                out = guest.settle(ipc.Settle(call_id=call_id, ok=True, value=payload))
    raise AssertionError("guest did not finish")


def value(finished: ipc.Finished) -> Any:
    """The successful result as Python (UNDEFINED for an omitted result)."""
    assert finished.ok, (finished.code, finished.message)
    return UNDEFINED if finished.result is None else json.loads(finished.result)


def error(finished: ipc.Finished) -> tuple[str | None, str]:
    assert not finished.ok, finished.result
    return finished.code, finished.message
