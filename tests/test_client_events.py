"""Watching an execution from the Python client and the shell: ``on_log``, ``Runner.events`` and
``execbox-runner exec``, against the real daemon (live logs) and a runner without live logs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from websockets.sync.server import ServerConnection

from execbox_runner.client import (
    DoneEvent,
    Event,
    LogEvent,
    Runner,
    RunnerUnavailable,
    ToolCallEvent,
)

from .daemonkit import Daemon, running_daemon, scripted_runner

BACKENDS = ["asyncio", "trio"]
backends = pytest.mark.parametrize("backend", BACKENDS)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as started:
        yield started


@backends
def test_on_log_sees_each_line_as_the_guest_writes_it(backend: str, daemon: Daemon) -> None:
    seen: list[str] = []

    def lines_so_far() -> list[str]:
        return list(seen)

    code = (
        "console.log('one'); console.log('two'); const at_tool = await t.lines_so_far(); console.log('three'); at_tool"
    )
    result = anyio.run(
        lambda: Runner.connect(daemon.url).execute(code, {"t": {"lines_so_far": lines_so_far}}, on_log=seen.append),
        backend=backend,
    )
    assert result.ok, result.error
    assert result.result == ["one", "two"]  # streamed before the guest called the tool
    assert seen == result.logs == ["one", "two", "three"]


@backends
def test_an_async_on_log_is_awaited_for_each_line(backend: str, daemon: Daemon) -> None:
    seen: list[str] = []

    async def show(line: str) -> None:
        await anyio.sleep(0)  # as a display pushing the line somewhere would
        seen.append(line)

    code = "console.log('one'); await t.pause(); console.log('two'); 3"
    result = anyio.run(
        lambda: Runner.connect(daemon.url).execute(code, {"t": {"pause": lambda: None}}, on_log=show), backend=backend
    )
    assert result.ok, result.error
    assert seen == result.logs == ["one", "two"]


def runner_without_live_logs(connection: ServerConnection, received: list[Any]) -> None:
    """execbox's own runner, as far as logs go: every line in the ``done``."""
    execute = json.loads(connection.recv(timeout=10))
    received.append(connection.request.headers.get("Execbox-Extensions") if connection.request else None)
    connection.send(json.dumps({"type": "started", "id": execute["id"]}))
    done = {"type": "done", "id": execute["id"], "ok": True, "durationMs": 1, "logs": ["a", "b"], "result": 1}
    connection.send(json.dumps(done))
    connection.recv(timeout=10)  # until the client closes


def test_on_log_gets_every_line_once_from_a_runner_without_live_logs() -> None:
    seen: list[str] = []
    with scripted_runner(runner_without_live_logs) as (url, received):
        result = Runner.connect(url).execute_sync("whatever", on_log=seen.append)
    assert received == ["live-logs"]  # asked for, not granted
    assert seen == result.logs == ["a", "b"]


@backends
def test_an_on_log_that_raises_cancels_the_execution_and_is_raised_as_it_is(backend: str) -> None:
    def runner_side(connection: ServerConnection, received: list[Any]) -> None:
        execute = json.loads(connection.recv(timeout=10))
        connection.send(json.dumps({"type": "started", "id": execute["id"]}))
        for line in ("first", "second"):
            connection.send(json.dumps({"type": "log", "id": execute["id"], "lines": [line]}))
        received.append(json.loads(connection.recv(timeout=10)))
        error = {"code": "timeout", "message": "Execution timed out"}
        done = {"type": "done", "id": execute["id"], "ok": False, "durationMs": 1, "logs": ["first"], "error": error}
        connection.send(json.dumps(done))
        connection.recv(timeout=10)  # until the client closes

    seen: list[str] = []

    def show(line: str) -> None:
        seen.append(line)
        raise RuntimeError("the display is gone")

    with scripted_runner(runner_side) as (url, received), pytest.raises(RuntimeError, match="the display is gone"):
        anyio.run(lambda: Runner.connect(url).execute("whatever", on_log=show), backend=backend)
    assert received == [{"type": "cancel", "id": received[0]["id"]}]
    assert seen == ["first"]  # not called again, not even with the done's lines


async def collect(runner: Runner, code: str, providers: Any = None, **limits: Any) -> list[Event]:
    async with runner.events(code, providers, **limits) as events:
        return [event async for event in events]


@backends
def test_events_show_the_execution_as_it_runs(backend: str, daemon: Daemon) -> None:
    code = "console.log('asking'); const r = await t.echo({v: 2}); console.log('got', r.v); r.v * 21"
    events = anyio.run(
        lambda: collect(Runner.connect(daemon.url), code, {"t": {"echo": lambda v: {"v": v}}}), backend=backend
    )
    assert events[:-1] == [LogEvent("asking"), ToolCallEvent("t", "echo", {"v": 2}), LogEvent("got 2")]
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.result.ok and done.result.result == 42
    assert done.result.logs == ["asking", "got 2"]


@backends
def test_leaving_the_events_early_cancels_the_execution(backend: str, daemon: Daemon) -> None:
    async def first_line() -> tuple[Event, float]:
        started = time.monotonic()
        async with Runner.connect(daemon.url).events(
            "console.log('spinning'); while (true) {}", timeout_ms=30_000
        ) as events:
            event = await events.__anext__()
        return event, time.monotonic() - started

    event, took = anyio.run(first_line, backend=backend)
    assert event == LogEvent("spinning")
    assert took < 10  # not the guest's 30 s: leaving the block cancelled it


@backends
def test_leaving_the_events_as_the_execution_ends_raises_nothing_of_its_own(backend: str, daemon: Daemon) -> None:
    """The done comes in while the block is left after the first line: it is dropped, and the block
    ends with the caller's own exception, or none, never a group of the client's."""

    async def leave(how: str) -> None:
        async with Runner.connect(daemon.url).events("console.log('only'); 2") as events:
            async for event in events:
                assert event == LogEvent("only")
                if how == "raise":
                    raise KeyError("the caller's own")
                break

    for _ in range(10):
        anyio.run(leave, "break", backend=backend)
        with pytest.raises(KeyError, match="the caller's own"):
            anyio.run(leave, "raise", backend=backend)


@backends
def test_a_runner_error_is_raised_by_the_iteration(backend: str) -> None:
    async def unreachable() -> None:
        async with Runner.connect("ws://127.0.0.1:9/", connect_timeout=5).events("1") as events:
            async for _ in events:
                pytest.fail("an event from no runner")

    with pytest.raises(RunnerUnavailable):
        anyio.run(unreachable, backend=backend)


def test_exec_prints_each_line_while_the_guest_still_runs(daemon: Daemon) -> None:
    command = [sys.executable, "-m", "execbox_runner", "exec", "--url", daemon.url, "--timeout-ms", "4000"]
    process = subprocess.Popen(
        [*command, "console.log('early'); while (true) {}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert process.stderr is not None
        assert process.stderr.readline() == "early\n"
        assert process.poll() is None  # the guest spins on: the line came while it ran
        _, rest = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 1 and "error: timeout" in rest and "early" not in rest  # shown once
