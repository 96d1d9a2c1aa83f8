"""The Python client from the host's side, over real sockets.

Behaviour tests run against the real daemon, on asyncio and on trio. Where the
runner must misbehave (never answer, vanish, send garbage), a small scripted
WebSocket server on loopback plays it and records what the client sent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.http11 import Request, Response
from websockets.sync.server import ServerConnection

from execbox_runner.client import (
    ErrorInfo,
    ExecuteResult,
    Providers,
    Runner,
    RunnerBusy,
    RunnerDisconnected,
    RunnerProtocolError,
    RunnerUnavailable,
    Tool,
    ToolError,
    Unauthorized,
    safe_name,
)

from .daemonkit import Daemon, certificate, children_of, client, process_state, running_daemon, scripted_runner

BACKENDS = ["asyncio", "trio"]
backends = pytest.mark.parametrize("backend", BACKENDS)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as started:
        yield started


def run(backend: str, runner: Runner, code: str, providers: Any = None, **limits: Any) -> ExecuteResult:
    return anyio.run(lambda: runner.execute(code, providers, **limits), backend=backend)


# ---------------------------------------------------------------- tools


def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b


async def fetch_page(url: str) -> dict[str, str]:
    await anyio.sleep(0)
    return {"url": url, "title": f"Title of {url}"}


@dataclasses.dataclass
class Point:
    x: float
    y: float


def fail_plainly() -> None:
    raise ValueError("the disk is on fire")


async def fail_with_code(city: str) -> None:
    raise ToolError("validation_error", f"no such city: {city}")


@backends
def test_sync_and_async_tools(backend: str, daemon: Daemon) -> None:
    code = """
        const page = await web.fetch_page({url: "https://example.com"});
        console.log("title:", page.title);
        const sum = await math.add({a: 40, b: 2});
        ({sum, next: await math.add({a: sum}), page})
    """
    result = run(backend, Runner.connect(daemon.url), code, {"math": {"add": add}, "web": {"fetch-page": fetch_page}})
    assert result.ok, result.error
    assert result.result == {
        "sum": 42,
        "next": 43,
        "page": {"url": "https://example.com", "title": "Title of https://example.com"},
    }
    assert result.logs == ["title: Title of https://example.com"]
    assert result.error is None
    assert isinstance(result.duration_ms, int)


@backends
def test_tools_the_guest_calls_and_never_awaits_still_run(backend: str, daemon: Daemon) -> None:
    """As execbox's host does, every tool call the runner sends starts, even one that comes just
    before the done; the execution does not wait for it to end, nor for a person's approval."""
    ran: list[str] = []

    def notify(to: str) -> None:
        ran.append(to)

    async def record(event: str) -> None:
        ran.append(event)
        await anyio.sleep(60)  # stopped as the execution ends

    async def never_approved(request: object) -> bool:
        await anyio.sleep(60)
        return False

    providers = {"tools": {"notify": notify, "record": record, "gated": Tool(notify, approve=never_approved)}}
    code = "tools.notify({to: 'a'}); tools.record({event: 'b'}); tools.gated({to: 'c'}); 5"
    runner = Runner.connect(daemon.url)

    async def execute() -> ExecuteResult:
        with anyio.fail_after(30):  # the tools' and the approver's sleeps are twice as long
            return await runner.execute(code, providers)

    result = anyio.run(execute, backend=backend)
    assert result.ok and result.result == 5, result.error
    assert sorted(ran) == ["a", "b"]


@backends
def test_tool_errors_keep_their_codes_and_only_their_message(backend: str, daemon: Daemon) -> None:
    providers = {"t": {"plain": fail_plainly, "coded": fail_with_code}}
    code = """
        const seen = [];
        try { await t.plain(); } catch (e) { seen.push([e.code, e.message]); }
        try { await t.coded({city: "Atlantis"}); } catch (e) { seen.push([e.code, e.message]); }
        seen
    """
    runner = Runner.connect(daemon.url)
    result = run(backend, runner, code, providers)
    assert result.result == [["tool_error", "the disk is on fire"], ["validation_error", "no such city: Atlantis"]]
    uncaught = run(backend, runner, "await t.coded({city: 'Atlantis'})", providers)
    assert uncaught.error == ErrorInfo("validation_error", "no such city: Atlantis")
    with pytest.raises(ValueError, match="unknown error code"):
        ToolError("oops", "no")


@backends
def test_inputs_are_validated_before_the_tool_runs(backend: str, daemon: Daemon) -> None:
    calls: list[Any] = []
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    providers = {
        "typed": {"add": add},
        "search": {"query": Tool(calls.append, input_schema=schema)},
        "checked": {"count": Tool(lambda: "three", output_schema={"type": "integer"})},
    }
    code = """
        const errors = [];
        for (const call of [
            () => typed.add({a: "one"}), () => typed.add({b: 2}), () => typed.add({a: 1, c: 3}),
            () => typed.add([1, 2]), () => search.query({q: 7}), () => checked.count(),
        ]) {
            try { await call(); errors.push("no error"); } catch (e) { errors.push(e.code + ": " + e.message); }
        }
        errors
    """
    result = run(backend, Runner.connect(daemon.url), code, providers)
    assert result.ok, result.error
    assert result.result == [
        "validation_error: Invalid input for tool add: Expected `int`, got `str` - at `$.a`",
        "validation_error: Invalid input for tool add: Object missing required field `a`",
        "validation_error: Invalid input for tool add: Object contains unknown field `c`",
        "validation_error: Invalid input for tool add: Expected `object`, got `array`",
        "validation_error: Invalid input for tool query: 7 is not of type 'string' at $.q",
        "validation_error: Invalid output for tool count: 'three' is not of type 'integer' at $",
    ]
    assert calls == []


@backends
def test_omitted_input_calls_the_tool_with_no_argument(backend: str, daemon: Daemon) -> None:
    received: list[Any] = []

    def now() -> str:
        return "2026-11-22"

    def remember(value: Any) -> str:
        received.append(value)
        return "ok"

    providers = {"clock": {"now": now, "add": add}, "raw": {"remember": Tool(remember, input_schema={})}}
    code = """
        let missing;
        try { await clock.add(); } catch (e) { missing = e.code; }
        [await clock.now(), await clock.now(undefined), await raw.remember(), missing]
    """
    result = run(backend, Runner.connect(daemon.url), code, providers)
    assert result.result == ["2026-11-22", "2026-11-22", "ok", "validation_error"]
    assert received == [None]


@backends
def test_results_that_are_not_json_are_serialization_errors_for_the_guest(backend: str, daemon: Daemon) -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    providers = {
        "bad": {"nan": lambda: math.nan, "object": object, "cycle": lambda: cyclic},
        "good": {"point": lambda: Point(1.5, 2), "pair": lambda: (1, {"a"})},
    }
    code = """
        const codes = [];
        for (const name of ["nan", "object", "cycle"]) {
            try { await bad[name](); } catch (e) { codes.push(e.code); }
        }
        [codes, await good.point(), await good.pair()]
    """
    result = run(backend, Runner.connect(daemon.url), code, providers)
    assert result.result == [["serialization_error"] * 3, {"x": 1.5, "y": 2}, [1, ["a"]]]


@backends
def test_cancelling_the_awaiting_task_cancels_the_execution(backend: str, daemon: Daemon) -> None:
    async def scenario() -> list[str]:
        events: list[str] = []
        called = anyio.Event()

        async def hang() -> None:
            called.set()
            try:
                await anyio.sleep_forever()
            finally:
                events.append("tool cancelled")

        runner = Runner.connect(daemon.url)
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(runner.execute, "await t.hang()", {"t": {"hang": hang}})
                await called.wait()
                group.cancel_scope.cancel()
            events.append("returned")
            after = await runner.execute("1 + 1")
        events.append(f"next execution: {after.result}")
        return events

    assert anyio.run(scenario, backend=backend) == ["tool cancelled", "returned", "next execution: 2"]


@backends
def test_many_executions_run_concurrently(backend: str, daemon: Daemon) -> None:
    count = 16

    async def scenario() -> list[Any]:
        arrived = 0
        everyone = anyio.Event()

        async def gather(i: int) -> int:
            nonlocal arrived
            arrived += 1
            if arrived == count:
                everyone.set()
            await everyone.wait()  # returns only once every execution is inside its tool call
            return i * 2

        results: list[Any] = [None] * count
        runner = Runner.connect(daemon.url)

        async def one(i: int) -> None:
            results[i] = (await runner.execute(f"await t.gather({{i: {i}}})", {"t": {"gather": gather}})).result

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for i in range(count):
                    group.start_soon(one, i)
        return results

    assert anyio.run(scenario, backend=backend) == [i * 2 for i in range(count)]


def test_sync_api(daemon: Daemon) -> None:
    with Runner.connect(daemon.url) as runner:
        result = runner.execute_sync("await math.add({a: 1, b: 2})", {"math": {"add": add}}, timeout_ms=2000)
    assert (result.ok, result.result) == (True, 3)
    guest_error = Runner.connect(daemon.url).execute_sync("throw new Error('nope')")
    assert guest_error.error == ErrorInfo("runtime_error", "nope")


@backends
def test_execute_sync_in_an_event_loop_says_to_await_execute(backend: str, daemon: Daemon) -> None:
    runner = Runner.connect(daemon.url)

    def nested() -> Any:
        return runner.execute_sync("40 + 2").result  # a worker thread runs no loop: allowed

    async def scenario() -> Any:
        with pytest.raises(RuntimeError, match=rf"\({backend}: .*use `await runner.execute\(...\)` there$"):
            runner.execute_sync("1")
        return (await runner.execute("await t.nested()", {"t": {"nested": nested}})).result

    assert anyio.run(scenario, backend=backend) == 42


# ---------------------------------------------------------------- refusals and failures


@pytest.fixture(scope="module")
def guarded() -> Iterator[Daemon]:
    with running_daemon("--tokens", "right-token", "--max-sessions", "1") as started:
        yield started


@backends
def test_a_wrong_token_is_refused(backend: str, guarded: Daemon) -> None:
    with pytest.raises(Unauthorized) as refused:
        run(backend, Runner.connect(guarded.url, token="wrong-token"), "1")
    assert refused.value.status == 401
    assert str(refused.value) == (  # the runner's reason, not its JSON body
        f"{guarded.url} refused the WebSocket handshake with HTTP 401: exactly one Authorization header with a "
        "valid bearer token is required"
    )
    assert json.loads(refused.value.body)["error"] == "unauthorized"
    assert run(backend, Runner.connect(guarded.url, token="right-token"), "1").result == 1


@backends
def test_a_full_runner_is_refused(backend: str, guarded: Daemon) -> None:
    """Sessions are held open until the runner refuses one (the first does, unless it is several processes)."""
    runner = Runner.connect(guarded.url, token="right-token")
    with contextlib.ExitStack() as held:
        for _ in range(16):
            try:
                run(backend, runner, "1")
            except RunnerBusy as refused:
                assert (refused.status, refused.retry_after) == (503, 1.0)
                return
            with contextlib.suppress(InvalidStatus):
                held.enter_context(client(guarded.url, additional_headers={"Authorization": "Bearer right-token"}))
    raise AssertionError("never refused")


@backends
def test_retries_wait_as_the_runner_says_but_never_past_the_timeout(backend: str) -> None:
    """Each handshake is answered 503 with ``Retry-After: 0.2``: three retries fit a 5 s timeout, and
    none fits a 100 ms one, which gets the refusal at once rather than after waiting."""
    handshakes: list[str] = []

    def busy(connection: ServerConnection, request: Request) -> Response:
        handshakes.append(request.path)
        response = connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, "busy\n")
        response.headers["Retry-After"] = "0.2"
        return response

    for timeout_ms, attempts in [(5000, 4), (100, 1)]:
        handshakes.clear()
        with (
            scripted_runner(record_until_closed, process_request=busy) as (url, _),
            pytest.raises(RunnerBusy) as refused,
        ):
            run(backend, Runner.connect(url, retries=3), "1", timeout_ms=timeout_ms)
        assert (refused.value.status, refused.value.retry_after) == (503, 0.2)
        assert len(handshakes) == attempts


@backends
def test_an_unreachable_runner(backend: str) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(RunnerUnavailable):
        run(backend, Runner.connect(f"ws://127.0.0.1:{port}/"), "1")


@backends
def test_every_connection_failure_names_its_reason(backend: str, daemon: Daemon, tmp_path: Path) -> None:
    secure = daemon.url.replace("ws://", "wss://")
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    certfile, keyfile, trusted = certificate(tmp_path)
    with running_daemon("--certfile", str(certfile), "--keyfile", str(keyfile)) as tls:
        plain = tls.url.replace("wss://", "ws://")
        cases = [
            (secure, None, r"TLS handshake failed: .+ \(is the runner serving plain ws://\?\)$"),
            (plain, None, r"the runner closed the connection during the handshake \(is the runner serving wss://\?\)$"),
            (tls.url, None, r"TLS certificate verification failed: .+"),
            (f"ws://127.0.0.1:{port}/", None, rf"connection refused \(nothing listens on 127\.0\.0\.1:{port}\)$"),
            ("ws://no-such-host.invalid/", None, r"cannot resolve the host name 'no-such-host\.invalid': .+"),
        ]
        for url, context, reason in cases:
            with pytest.raises(RunnerUnavailable, match=rf"^cannot connect to {re.escape(url)}: {reason}"):
                run(backend, Runner.connect(url, ssl_context=context), "1")
        assert run(backend, Runner.connect(tls.url, ssl_context=trusted), "1").result == 1


@backends
def test_a_refused_execute_is_told_from_a_guests_validation_error(backend: str, daemon: Daemon) -> None:
    refused = run(backend, Runner.connect(daemon.url), "1", timeout_ms=10**9)
    assert (refused.ok, refused.refused, refused.error) == (
        False,
        True,
        ErrorInfo("validation_error", "timeoutMs 1000000000 exceeds this runner's maximum of 300000"),
    )

    def reject() -> None:
        raise ToolError("validation_error", "not that")

    guest = run(backend, Runner.connect(daemon.url), "await t.reject()", {"t": {"reject": reject}})
    assert (guest.refused, guest.error) == (False, ErrorInfo("validation_error", "not that"))
    assert not run(backend, Runner.connect(daemon.url), "1").refused


@backends
def test_an_unknown_keyword_is_a_type_error_before_anything_runs(backend: str) -> None:
    nowhere = Runner.connect("ws://127.0.0.1:1/")  # a connection would fail: the keyword is refused first
    for keyword, hint in [
        ("timeoutMs", "; did you mean 'timeout_ms'?"),
        ("maxLogLines", "; did you mean 'max_log_lines'?"),
        ("timeout_msec", "; did you mean 'timeout_ms'?"),
        ("colour", "; the limits are timeout_ms, memory_limit_bytes, max_log_lines, max_log_chars"),
    ]:
        message = f"got an unexpected keyword argument '{keyword}'{hint}"
        with pytest.raises(TypeError, match=re.escape(f"Runner.execute() {message}")):
            run(backend, nowhere, "1", **{keyword: 300})
        with pytest.raises(TypeError, match=re.escape(f"Runner.execute_sync() {message}")):
            nowhere.execute_sync("1", **{keyword: 300})


@backends
def test_a_bad_limit_or_tool_is_a_value_error_before_anything_runs(backend: str) -> None:
    nowhere = Runner.connect("ws://127.0.0.1:1/")  # a connection would fail: the value is refused first

    async def events(limits: dict[str, Any], providers: Any = None) -> None:
        async with nowhere.events("1", providers, **limits):
            pytest.fail("entered the block")

    for limits, message in [
        ({"timeout_ms": "x"}, "invalid timeout_ms: Expected `float`, got `str`"),
        ({"timeout_ms": 0}, "invalid timeout_ms: Expected `float` > 0.0"),
        ({"memory_limit_bytes": 1.5}, "invalid memory_limit_bytes: Expected `float` that's a multiple of 1.0"),
    ]:
        exactly = f"^{re.escape(message)}$"
        with pytest.raises(ValueError, match=exactly):
            run(backend, nowhere, "1", **limits)
        with pytest.raises(ValueError, match=exactly):
            nowhere.execute_sync("1", **limits)
        with pytest.raises(ValueError, match=exactly):  # raised on entering, not in an exception group
            anyio.run(events, limits, backend=backend)
    with pytest.raises(TypeError, match="is variadic positional"):
        anyio.run(events, {}, {"t": {"f": lambda *args: None}}, backend=backend)


def test_a_bad_url_or_token_is_refused_by_connect() -> None:
    for url, reason in [
        ("http://x", "scheme isn't ws or wss"),
        ("ws://", "hostname isn't provided"),
        ("ws://127.0.0.1:99999/", "port out of range 0-65535"),
        ("ws://127.0.0.1:0/", "port 0 cannot be connected to"),
        ("ws://127.0.0.1:1/ x", "it holds spaces or control characters"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"not a ws:// or wss:// URL: {url!r} ({reason})")):
            Runner.connect(url)
    for keyword, value, message in [
        ("connect_timeout", 0, "connect_timeout must be a number of seconds above 0, not 0"),
        ("connect_timeout", "5", "connect_timeout must be a number of seconds above 0, not '5'"),
        ("connect_timeout", math.nan, "connect_timeout must be a number of seconds above 0, not nan"),
        ("retries", -1, "retries must be a whole number from 0, not -1"),
        ("retries", "3", "retries must be a whole number from 0, not '3'"),
    ]:
        with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
            Runner.connect("ws://127.0.0.1:1/", **{keyword: value})
    for token in ["a\nb", "", "two words", "t\u00f6ken"]:
        with pytest.raises(ValueError, match=r"^the token must be printable ASCII without spaces, and not empty"):
            Runner.connect("ws://127.0.0.1:1/", token=token)  # the message never shows the token


def descendants(pid: int) -> list[int]:
    return [pid for child in children_of(pid) for pid in [child, *descendants(child)]]


def test_a_runner_that_dies_mid_execution() -> None:
    with running_daemon() as doomed:

        def kill_runner() -> str:
            """SIGKILL the daemon and every process under it, whichever of them holds the connection; parents
            first, so that none of them sees a child die and sends a `done` about it."""
            for pid in [doomed.process.pid, *descendants(doomed.process.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return "too late"

        with pytest.raises(RunnerDisconnected):
            run("asyncio", Runner.connect(doomed.url), "await t.kill()", {"t": {"kill": kill_runner}})


def test_an_execution_that_finds_its_private_daemon_dying_starts_another() -> None:
    """Killed just before an execution, the private daemon may have closed its port while it cannot
    be reaped yet: the execution waits for it to exit and starts another, rather than failing with
    RunnerUnavailable (it did, now and then, as code mode's call right after such a kill)."""

    def daemons() -> list[int]:
        """This test's private daemons: the serve processes under this one that other tests did not start."""
        return [
            pid
            for pid in children_of(os.getpid())
            if pid not in others and b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]

    others: list[int] = []
    others = daemons()
    with Runner.local() as runner:
        for n in range(3):
            assert runner.execute_sync(f"{n} * 2").result == n * 2
            (daemon,) = daemons()
            os.kill(daemon, signal.SIGKILL)  # and at once, with no wait for it to go, the next execution
        assert runner.execute_sync("6 * 7").result == 42
        assert len(daemons()) == 1

        async def together(n: int) -> list[object]:
            """``n`` executions at once: one restarts the daemon; the others take the one it started."""
            results: list[object] = []

            async def one(index: int) -> None:
                results.append((await runner.execute(f"{index} + 100")).result)

            async with anyio.create_task_group() as group:
                for index in range(n):
                    group.start_soon(one, index)
            return sorted(results, key=str)

        for _ in range(3):
            (daemon,) = daemons()
            os.kill(daemon, signal.SIGKILL)  # the private daemon this test started
            assert anyio.run(together, 4) == [100, 101, 102, 103]
        assert len(daemons()) == 1


# ---------------------------------------------------------------- a scripted runner


def record_until_closed(connection: ServerConnection, received: list[Any]) -> None:
    for _ in range(100):
        try:
            received.append(json.loads(connection.recv(timeout=10)))
        except ConnectionClosed:
            received.append("closed")
            return


@backends
def test_the_backstop_cancels_then_drops_a_runner_that_never_answers(backend: str) -> None:
    with scripted_runner(record_until_closed) as (url, received):
        result = run(backend, Runner.connect(url), "1", timeout_ms=100)
    assert result.error == ErrorInfo("timeout", "Execution timed out")
    assert (result.ok, result.logs) == (False, [])
    execute, cancel, closed = received
    assert execute["type"] == "execute" and execute["options"]["timeoutMs"] == 100
    assert cancel == {"type": "cancel", "id": execute["id"]}
    assert closed == "closed"


@backends
def test_cancelling_sends_cancel_and_takes_the_runners_done(backend: str) -> None:
    def runner_side(connection: ServerConnection, received: list[Any]) -> None:
        execute = json.loads(connection.recv(timeout=10))
        connection.send(json.dumps({"type": "started", "id": execute["id"]}))
        call = {"type": "tool_call", "callId": "call-1", "providerName": "t", "safeToolName": "hang", "input": {}}
        connection.send(json.dumps(call))
        received.append(json.loads(connection.recv(timeout=10)))
        error = {"code": "timeout", "message": "Execution timed out"}
        connection.send(
            json.dumps({"type": "done", "id": execute["id"], "ok": False, "durationMs": 1, "logs": [], "error": error})
        )
        record_until_closed(connection, received)

    async def scenario(url: str) -> None:
        async def hang() -> None:
            await anyio.sleep_forever()

        with anyio.move_on_after(0.2):
            await Runner.connect(url).execute("await t.hang()", {"t": {"hang": hang}})

    with scripted_runner(runner_side) as (url, received):
        anyio.run(scenario, url, backend=backend)
    assert received[0]["type"] == "cancel"
    assert received[1:] == ["closed"]


@backends
def test_a_runner_that_closes_the_connection_says_with_which_code_and_why(backend: str, daemon: Daemon) -> None:
    def too_big() -> str:
        return "x" * (16 * 1024 * 1024)  # with its message around it, over the daemon's --max-message-bytes

    with pytest.raises(RunnerDisconnected) as closed:
        run(backend, Runner.connect(daemon.url), "(await t.too_big()).length", {"t": {"too_big": too_big}})
    assert closed.value.code == 1009
    assert re.fullmatch(r"the runner closed the connection \(1009: .*exceeds limit.*\)", str(closed.value))
    assert closed.value.reason in str(closed.value)


@backends
def test_a_runner_that_vanishes_or_talks_nonsense(backend: str) -> None:
    def vanish(connection: ServerConnection, received: list[Any]) -> None:
        connection.recv(timeout=10)
        connection.socket.shutdown(socket.SHUT_RDWR)

    def nonsense(connection: ServerConnection, received: list[Any]) -> None:
        connection.recv(timeout=10)
        connection.send("this is not JSON")
        record_until_closed(connection, received)

    with scripted_runner(vanish) as (url, _), pytest.raises(RunnerDisconnected):
        run(backend, Runner.connect(url), "1")
    with scripted_runner(nonsense) as (url, _), pytest.raises(RunnerProtocolError):
        run(backend, Runner.connect(url), "1")


def test_a_call_to_an_unknown_tool_is_answered() -> None:
    def runner_side(connection: ServerConnection, received: list[Any]) -> None:
        execute = json.loads(connection.recv(timeout=10))
        connection.send(json.dumps({"type": "tool_call", "callId": "c1", "providerName": "nope", "safeToolName": "x"}))
        received.append(json.loads(connection.recv(timeout=10)))
        connection.send(json.dumps({"type": "done", "id": execute["id"], "ok": True, "durationMs": 1, "logs": []}))

    with scripted_runner(runner_side) as (url, received):
        result = run("trio", Runner.connect(url), "1")
    assert (result.ok, result.result) == (True, None)
    error = {"code": "internal_error", "message": "Unknown tool nope.x"}
    assert received == [{"type": "tool_result", "callId": "c1", "ok": False, "error": error}]


# ---------------------------------------------------------------- the local runner


def test_local_runner_sync_is_private_and_stopped_on_errors() -> None:
    runner = Runner.local()
    with pytest.raises(KeyError), runner:
        url = runner.url
        assert runner.execute_sync("await t.add({a: 1})", {"t": {"add": add}}).result == 2
        with pytest.raises(Unauthorized):
            Runner.connect(url).execute_sync("1")  # no token: only this runner may use it
        raise KeyError("an error in the host's code")
    with pytest.raises(RunnerUnavailable):
        Runner.connect(url).execute_sync("1")


async def test_local_runner_async() -> None:
    async with Runner.local() as runner:
        url = runner.url
        assert (await runner.execute("6 * 7")).result == 42
    with pytest.raises(RuntimeError, match="start the local runner"):
        await runner.execute("1")
    with pytest.raises(RunnerUnavailable):
        await Runner.connect(url).execute("1")


def test_a_local_runner_stops_by_itself_when_its_host_process_is_killed() -> None:
    """A host killed with SIGKILL cannot stop its private daemon: the daemon sees its owner gone, drains
    and exits, with its workers, rather than serving on as an orphan."""
    host_code = "import time\nfrom execbox_runner.client import Runner\nwith Runner.local():\n    print('in', flush=True)\n    time.sleep(300)"
    host = subprocess.Popen([sys.executable, "-c", host_code], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None and host.stdout.readline() == "in\n"
        [daemon] = children_of(host.pid)
        owned = [daemon, *descendants(daemon)]
    finally:
        host.kill()
        host.wait(timeout=10)
    deadline = time.monotonic() + 30
    while any(process_state(pid) not in ("gone", "Z") for pid in owned) and time.monotonic() < deadline:
        time.sleep(0.1)
    serving = [pid for pid in owned if process_state(pid) not in ("gone", "Z")]  # a zombie until init reaps it
    for pid in serving:
        os.kill(pid, signal.SIGKILL)
    assert serving == []


def test_exec_command(daemon: Daemon, tmp_path: Path) -> None:
    def execbox_runner_exec(*args: str) -> tuple[int, str, str]:
        done = subprocess.run(
            [sys.executable, "-m", "execbox_runner", "exec", *args], capture_output=True, text=True, timeout=120
        )
        return done.returncode, done.stdout, done.stderr

    assert execbox_runner_exec("console.log('hi'); ({answer: 6 * 7})", "--url", daemon.url) == (
        0,
        '{"answer": 42}\n',
        "hi\n",
    )
    assert execbox_runner_exec("throw new Error('no')", "--url", daemon.url) == (1, "", "error: runtime_error: no\n")
    guest = tmp_path / "guest.js"
    guest.write_text("const words = ['local', 'runner'];\nwords.join(' ')\n")
    assert execbox_runner_exec(str(guest)) == (0, '"local runner"\n', "")


# ---------------------------------------------------------------- manifests


def test_safe_names_follow_execbox() -> None:
    cases = {
        "scrape-url": "scrape_url",
        "123abc": "_123abc",
        "delete": "delete_",
        "  ": "_",
        "__x__": "x",
        "a.b c": "a_b_c",
    }
    assert {name: safe_name(name) for name in cases} == cases


def test_manifests_and_types() -> None:
    providers = Providers({"web": {"fetch-page": fetch_page, "fetch page": fetch_page, "add": add}})
    (manifest,) = providers.manifests
    assert {safe: (tool.safeName, tool.originalName) for safe, tool in manifest.tools.items()} == {
        "fetch_page": ("fetch_page", "fetch-page"),
        "fetch_page__2": ("fetch_page__2", "fetch page"),
        "add": ("add", "add"),
    }
    assert manifest.tools["add"].description == "Add two numbers."
    assert providers.types == manifest.types
    assert "function fetch_page(input: {\n    url: string;\n  }): Promise<Record<string, string>>;" in providers.types
    assert (
        "/**\n   * Add two numbers.\n   */\n  function add(input: {\n    a: number;\n    b?: number;\n  }): Promise<number>;"
        in (providers.types)
    )


def test_tools_that_cannot_be_described_are_refused_up_front() -> None:
    with pytest.raises(ValueError, match="Invalid provider namespace"):
        Providers({"not-an-identifier": {}})
    with pytest.raises(TypeError, match="is variadic positional"):
        Providers({"t": {"f": lambda *args: None}})
    with pytest.raises(ValueError, match="invalid JSON Schema"):
        Providers({"t": {"f": Tool(print, input_schema={"type": "no-such-type"})}})


def test_tools_whose_signature_cannot_be_read_are_refused_naming_the_tool() -> None:
    @dataclasses.dataclass
    class Local:  # with ``from __future__ import annotations``, a hint naming it cannot be resolved
        x: int

    def uses_local(value: Local) -> int:
        return value.x

    with pytest.raises(TypeError, match=r"^tool 'f': cannot resolve its type hints \(name 'Local' is not defined\)"):
        Providers({"t": {"f": uses_local}})
    for tool, kind, message in [
        (dict, ValueError, "tool 'f': no signature found for builtin type <class 'dict'>; give a Python function"),
        (None, TypeError, "tool 'f': None is not a callable object; give a Python function"),
    ]:
        with pytest.raises(kind, match=f"^{re.escape(message)}$"):
            Providers({"t": {"f": tool}})
