"""Soak: a seeded random mix of host sessions against one daemon for minutes, checking invariants.

``--clients`` threads (default 32) each run sessions back to back for ``--duration``
seconds (default 120), drawn from a seeded mix: ok executions with logs, 1-10 tool
calls, failing tool results, guests that throw, memory bombs, spinning guests
with short ``timeoutMs``, cancels of parked and of spinning guests, several
executions on one connection, hosts that vanish mid-execution (TCP RST, or a
close without a close frame), hostile frames, slow tools (0.5-2 s). Beside them,
``--sentinels`` (default 2) innocent executions stay parked on a tool for 40 s
each, long enough to outlive any worker the daemon gives up on (it kills a worker
stuck in an aborted execution 32.5 s after the abort), and must end ``ok``.

    python benchmarks/soak.py [--duration 120] [--clients 32] [--sentinels 2] [--seed 1]
        [--kinds hostile,disconnect] [--daemon-arg=--profile=hardened] [--url ws://... --daemon-pid PID]

Checked per session: exactly one ``done`` per accepted execution, with the
expected ``ok`` / error code, and the lines a guest logged (a spinning guest
ended by its ``timeoutMs`` or a cancel keeps every line); each hostile frame gets its documented answer
(docs/reference/protocol.md, "Bad input": a ``done`` with a stable code, or a close frame with its
code, never a bare TCP close); every closing handshake is answered. Checked
every second: the daemon is alive and ``/healthz`` answers; after the load, no
session is left open. Printed: counts per kind, cancel and timeout latencies,
the RSS of the daemon's process tree (daemon, zygotes, workers) at the start,
peak and end and its slope over the second half. The exit status is 1 only
when an invariant broke, never because of a timing. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from benchkit.client import IO_TIMEOUT_S, BlockingClient
from benchkit.processes import start_daemon
from benchkit.procfs import tree_cpu_seconds, tree_rss_bytes
from benchkit.stats import percentile
from benchkit.workload import OPTIONS, cancel_message, execute_message, providers, tool_code, tool_sum
from websockets.protocol import State
from websockets.uri import WebSocketURI, parse_uri

MANIFEST: Final = providers("echo", "hang")  # the host never answers ``hang``
SESSION_LIMIT_S: Final = 45.0  # no session of the mix needs more; each read is bounded by IO_TIMEOUT_S too
# A sentinel's tool answers this late: longer than the daemon's abort grace (2.5 s) plus the 30 s after
# which it kills a worker still stuck in an aborted execution, with every execution that worker hosts.
PARK_S: Final = 40.0
HEALTH_TIMEOUT_S: Final = 5.0
SAMPLE_EVERY_S: Final = 1.0
PROGRESS_EVERY_S: Final = 10.0
SETTLE_S: Final = 15.0  # after the load, for the daemon to close every session
STABLE_CODES: Final = frozenset(
    [
        "timeout",
        "memory_limit",
        "validation_error",
        "tool_error",
        "runtime_error",
        "serialization_error",
        "internal_error",
    ]
)
MiB: Final = 1 << 20


class Violation(Exception):
    """A broken invariant; the message says what was sent and what came back."""


# ---------------------------------------------------------------- what is counted


@dataclass
class Tally:
    """Everything the client threads count, behind one lock."""

    shown: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: Counter[str] = field(default_factory=Counter)
    session_violations: Counter[str] = field(default_factory=Counter)
    variants: Counter[str] = field(default_factory=Counter)
    dones: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    violations: int = 0
    described: list[str] = field(default_factory=list)
    samples_ms: dict[str, list[float]] = field(default_factory=dict)

    def count(self, counter: Counter[str], key: str) -> None:
        with self.lock:
            counter[key] += 1

    def sample(self, name: str, ms: float) -> None:
        with self.lock:
            self.samples_ms.setdefault(name, []).append(ms)

    def violation(self, where: str, detail: str) -> None:
        with self.lock:
            self.violations += 1
            if len(self.described) < self.shown:
                self.described.append(f"[{time.strftime('%H:%M:%S')}] {where}: {detail}")


# ---------------------------------------------------------------- one host connection


class Host:
    """One host connection (``BlockingClient``) with its single message iterator and a short transcript."""

    def __init__(self, uri: WebSocketURI, tally: Tally, deadline: float) -> None:
        self.client = BlockingClient(uri)
        self.texts: Iterator[bytes] = self.client.texts()
        self.tally = tally
        self.deadline = deadline
        self.transcript: list[str] = []
        self.t0 = time.monotonic()

    def note(self, line: str) -> None:
        """Keep the last frames, each with its time since the connection opened."""
        self.transcript = [*self.transcript[-5:], f"+{time.monotonic() - self.t0:.2f}s {line[:160]}"]

    def send(self, data: bytes, binary: bool = False) -> None:
        self.note(f"> {data[:140]!r}{' (binary)' if binary else ''}")
        if binary:
            self.client.ws.send_binary(data)
            self.client.flush()
        else:
            self.client.send_text(data)

    def receive(self, waiting_for: str) -> dict[str, Any] | None:
        """The next runner message; None once the connection has ended."""
        if time.monotonic() > self.deadline:
            raise Violation(f"session past its time limit, waiting for {waiting_for}")
        try:
            text = next(self.texts)
        except StopIteration:
            return None
        except TimeoutError:
            raise Violation(f"nothing from the runner within {IO_TIMEOUT_S:g} s, waiting for {waiting_for}") from None
        self.note(f"< {text[:140]!r}")
        try:
            message = json.loads(text)
        except ValueError:
            raise Violation(f"runner sent a frame that is not JSON: {text[:100]!r}") from None
        if not isinstance(message, dict):
            raise Violation(f"runner sent a non-object: {text[:100]!r}")
        return message

    def ended(self) -> str:
        """How the connection ended, as the runner closed it."""
        close = self.client.ws.close_rcvd
        return "a bare TCP close (no close frame)" if close is None else f"close {close.code} {close.reason!r}"

    def execute(
        self,
        exec_id: str,
        code: str,
        options: dict[str, int] = OPTIONS,
        on_tool_call: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Send an accepted ``execute``; answer its tool calls; return its one ``done``."""
        self.send(execute_message(exec_id, code, options, MANIFEST))
        started = False
        while True:
            message = self.receive(f"the done of {exec_id}")
            if message is None:
                raise Violation(f"connection ended before the done of {exec_id}: {self.ended()}")
            kind = message.get("type")
            if message.get("id", exec_id) != exec_id:
                raise Violation(f"{kind} for id {message.get('id')!r} while {exec_id} runs")
            if kind == "started":
                if started:
                    raise Violation(f"a second started for {exec_id}")
                started = True
            elif kind == "tool_call" and started:
                (on_tool_call or self.echo)(message)
            elif kind == "done" and started:
                error = message.get("error")
                self.tally.count(self.tally.dones, "ok" if message.get("ok") else str((error or {}).get("code")))
                return message
            else:
                raise Violation(f"{kind} {'before started' if not started else 'unexpected'} for {exec_id}")

    def echo(self, call: dict[str, Any], delay_s: float = 0.0) -> None:
        """Answer ``call`` with ``ok: true`` and its input as the result."""
        time.sleep(delay_s)
        reply: dict[str, Any] = {"type": "tool_result", "callId": call["callId"], "ok": True}
        if "input" in call:
            reply["result"] = call["input"]
        self.send(json.dumps(reply).encode())

    def until_closed(self, waiting_for: str) -> list[dict[str, Any]]:
        """Every message until the runner's close; that close must be a close frame."""
        messages = []
        while (message := self.receive(waiting_for)) is not None:
            messages.append(message)
        if self.client.ws.close_rcvd is None:
            raise Violation(f"{waiting_for}: got a bare TCP close (no close frame) after {messages}")
        return messages

    def finish(self) -> None:
        """The host's closing handshake: nothing may arrive after the last ``done``, and the runner answers."""
        if self.client.ws.state is State.OPEN:
            self.client.ws.send_close(1000)
            self.client.flush()
        stray = self.until_closed("the answer to our close")
        if stray:
            raise Violation(f"messages after the last done: {stray}")

    def abort(self, reset: bool) -> None:
        """Vanish: a TCP RST (``SO_LINGER`` 0), or a plain close with no close frame."""
        if reset:
            self.client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.client.sock.close()


def expect(done: dict[str, Any], code: str | None, result: Any = ..., logs: list[str] | None = None) -> None:
    """``done`` is ``ok`` (``code`` None, with ``result`` unless ...) or failed with ``code``."""
    error = done.get("error") or {}
    if code is None and (done.get("ok") is not True or (result is not ... and done.get("result") != result)):
        raise Violation(f"expected ok with result {result!r}, got {done}")
    if code is not None and (done.get("ok") is not False or error.get("code") != code):
        raise Violation(f"expected {code}, got {done}")
    if logs is not None and done.get("logs") != logs:
        raise Violation(f"expected logs {logs}, got {done.get('logs')}")


# ---------------------------------------------------------------- executions (on an open connection)


@dataclass
class Session:
    """One session's context: its random source, id prefix and counts."""

    rng: random.Random
    prefix: str
    tally: Tally
    executions: int = 0

    def next_id(self) -> str:
        self.executions += 1
        return f"{self.prefix}e{self.executions}"


def run_ok_logs(s: Session, host: Host) -> None:
    n = s.rng.randint(1, 5)
    done = host.execute(s.next_id(), f"for (let i = 0; i < {n}; i++) console.log('line', i); ({{n: {n}}})")
    expect(done, None, {"n": n}, [f"line {i}" for i in range(n)])


def run_tools(s: Session, host: Host) -> None:
    n = s.rng.randint(1, 10)
    expect(host.execute(s.next_id(), tool_code(n)), None, tool_sum(n))


def run_slow_tools(s: Session, host: Host) -> None:
    n = s.rng.randint(1, 3)
    delays = [s.rng.uniform(0.5, 2.0) for _ in range(n)]
    done = host.execute(
        s.next_id(), tool_code(n), {**OPTIONS, "timeoutMs": 20_000}, lambda call: host.echo(call, delays.pop())
    )
    expect(done, None, tool_sum(n))


def run_tool_error(s: Session, host: Host) -> None:
    """A failing ``tool_result``: uncaught it is the execution's error (unknown codes become ``tool_error``)."""
    code = s.rng.choice(["tool_error", "validation_error", "not_found"])
    caught = s.rng.random() < 0.3
    s.tally.count(s.tally.variants, f"tool_error:{code}{':caught' if caught else ''}")

    def fail(call: dict[str, Any]) -> None:
        error = {"code": code, "message": "soak tool failed"}
        host.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": False, "error": error}).encode())

    guest = "await tools.echo({})"
    if caught:
        guest = f"let m; try {{ {guest} }} catch (e) {{ m = e.message }} m"
    done = host.execute(s.next_id(), guest, on_tool_call=fail)
    if caught:
        expect(done, None, "soak tool failed")
    else:
        expect(done, code if code in STABLE_CODES else "tool_error")
        if done["error"].get("message") != "soak tool failed":
            raise Violation(f"expected the host's message, got {done}")


def run_throw(s: Session, host: Host) -> None:
    n = s.rng.randint(0, 999)
    done = host.execute(s.next_id(), f"console.log('about to throw'); throw new Error('soak boom {n}')")
    expect(done, "runtime_error", logs=["about to throw"])
    if done["error"].get("message") != f"soak boom {n}":
        raise Violation(f"expected message 'soak boom {n}', got {done}")


MEMORY_BOMBS: Final = [
    "const a = []; while (true) a.push(new Array(4096).fill(a.length));",
    "const m = {}; for (let i = 0; ; i++) m['k' + i] = {i};",
    "new ArrayBuffer(64 * 1024 * 1024).byteLength",
    "let s = 'ab'; while (true) s = s + s + 'x';",
    "JSON.parse('['.repeat(1e6) + ']'.repeat(1e6))",
]


def run_memory_bomb(s: Session, host: Host) -> None:
    limit = s.rng.choice([1, 2, 4, 8, 16]) * MiB
    bomb = s.rng.randrange(len(MEMORY_BOMBS))
    s.tally.count(s.tally.variants, f"memory_bomb:{bomb}")
    done = host.execute(s.next_id(), MEMORY_BOMBS[bomb], {**OPTIONS, "memoryLimitBytes": limit, "timeoutMs": 10_000})
    expect(done, "memory_limit")


def run_timeout(s: Session, host: Host) -> None:
    """A guest that logs, then spins past its ``timeoutMs``: its ``done`` must keep the line (it has
    at least 300 ms to write it, time enough even for a worker starved by a saturated machine)."""
    timeout_ms = s.rng.randint(300, 800)
    sent = time.perf_counter()
    done = host.execute(s.next_id(), "console.log('spinning'); while (true) {}", {**OPTIONS, "timeoutMs": timeout_ms})
    s.tally.sample("timeout: done - timeoutMs (host)", (time.perf_counter() - sent) * 1000 - timeout_ms)
    expect(done, "timeout", logs=["spinning"])
    s.tally.sample("timeout: durationMs - timeoutMs", done["durationMs"] - timeout_ms)


def run_cancel_parked(s: Session, host: Host) -> None:
    exec_id = s.next_id()
    sent: list[float] = []

    def cancel(call: dict[str, Any]) -> None:
        time.sleep(s.rng.uniform(0, 0.2))
        sent.append(time.perf_counter())
        host.send(cancel_message(exec_id))

    done = host.execute(exec_id, "await tools.hang({})", {**OPTIONS, "timeoutMs": 60_000}, cancel)
    if not sent:
        raise Violation(f"done before the cancel: {done}")
    s.tally.sample("cancel -> done (parked)", (time.perf_counter() - sent[0]) * 1000)
    expect(done, "timeout")


def run_cancel_spinning(s: Session, host: Host) -> None:
    exec_id = s.next_id()
    sent: list[float] = []

    def resume_then_cancel(call: dict[str, Any]) -> None:
        host.echo(call)
        time.sleep(s.rng.uniform(0.2, 0.4))  # the guest has logged and spins by now, even on a saturated machine
        sent.append(time.perf_counter())
        host.send(cancel_message(exec_id))

    code = "await tools.echo(1); console.log('before'); while (true) {}"
    done = host.execute(exec_id, code, {**OPTIONS, "timeoutMs": 60_000}, resume_then_cancel)
    if not sent:
        raise Violation(f"done before the cancel: {done}")
    s.tally.sample("cancel -> done (spinning)", (time.perf_counter() - sent[0]) * 1000)
    expect(done, "timeout", logs=["before"])


EXECUTIONS: Final[dict[str, Callable[[Session, Host], None]]] = {
    "ok_logs": run_ok_logs,
    "tools": run_tools,
    "tool_error": run_tool_error,
    "throw": run_throw,
    "memory_bomb": run_memory_bomb,
    "timeout": run_timeout,
    "cancel_parked": run_cancel_parked,
    "cancel_spinning": run_cancel_spinning,
    "slow_tools": run_slow_tools,
}

# ---------------------------------------------------------------- sessions (a connection each)


def sequence(s: Session, host: Host) -> None:
    """2-5 executions of any kind, one after another on one connection."""
    for _ in range(s.rng.randint(2, 5)):
        EXECUTIONS[s.rng.choice(sorted(EXECUTIONS))](s, host)
    host.finish()


def disconnect(s: Session, host: Host) -> None:
    """Vanish mid-execution: before ``started``, parked on a tool, spinning, or right after a ``tool_result``."""
    at = s.rng.choice(["before_started", "parked", "spinning", "after_tool_result"])
    reset = s.rng.random() < 0.5
    s.tally.count(s.tally.variants, f"disconnect:{at}:{'rst' if reset else 'fin'}")
    exec_id = s.next_id()
    code = {"spinning": "while (true) {}", "after_tool_result": "await tools.echo(1); while (true) {}"}
    host.send(
        execute_message(exec_id, code.get(at, "await tools.hang({})"), {**OPTIONS, "timeoutMs": 30_000}, MANIFEST)
    )
    if at != "before_started":
        wanted = "started" if at == "spinning" else "tool_call"
        while (message := host.receive(f"the {wanted} of {exec_id}")) is not None and message.get("type") != wanted:
            if message.get("type") != "started":
                raise Violation(f"expected {wanted}, got {message}")
        if message is None:
            raise Violation(f"connection ended before {wanted}: {host.ended()}")
        if at == "after_tool_result":
            host.echo(message)
        time.sleep(s.rng.uniform(0, 0.1))
    host.abort(reset)


IDLE_FRAMES: Final[dict[str, tuple[bytes, int]]] = {
    "invalid_json": (b'{"type": "execute", "id": ', 1007),
    "invalid_utf8": (b'{"type":"cancel","id":"\xff\xfe"}', 1007),
    "deep_json": (b"[" * 20_000 + b"]" * 20_000, 1008),
    "unknown_type": (b'{"type":"bogus","id":"x"}', 1008),
    "not_an_object": (b"[1, 2, 3]", 1008),
    "malformed_cancel": (b'{"type":"cancel","id":5}', 1008),
    "binary": (b"\x00\x01\x02", 1003),
}
ACTIVE_FRAMES: Final[dict[str, tuple[bytes, int]]] = {
    **IDLE_FRAMES,
    "malformed_tool_result": (b'{"type":"tool_result","callId":7,"ok":true}', 1008),
    "deep_tool_result": (
        b'{"type":"tool_result","callId":"call-1","ok":true,"result":' + IDLE_FRAMES["deep_json"][0] + b"}",
        1008,
    ),
}
INVALID_EXECUTES: Final[dict[str, bytes]] = {
    "code_not_string": b'{"type":"execute","id":"%s","code":5,"options":%s,"providers":[]}',
    "timeout_infinite": b'{"type":"execute","id":"%s","code":"1","options":%s,"providers":[]}',
    "max_log_lines_negative": b'{"type":"execute","id":"%s","code":"1","options":%s,"providers":[]}',
    "timeout_over_max": b'{"type":"execute","id":"%s","code":"1","options":%s,"providers":[]}',
    "no_providers": b'{"type":"execute","id":"%s","code":"1","options":%s}',
}


def invalid_options(variant: str) -> bytes:
    """The options text of an invalid ``execute`` variant (JSON no Python value serializes to, such as 1e400)."""
    options = {k: str(v).encode() for k, v in OPTIONS.items()}
    options |= {
        "timeout_infinite": {"timeoutMs": b"1e400"},
        "max_log_lines_negative": {"maxLogLines": b"-1"},
        "timeout_over_max": {"timeoutMs": b"600000"},
    }.get(variant, {})
    return b"{" + b",".join(b'"' + k.encode() + b'":' + v for k, v in options.items()) + b"}"


def hostile(s: Session, host: Host) -> None:
    """A hostile frame, idle or while an execution is parked on a tool; or an invalid or second ``execute``."""
    state = s.rng.choice(["idle", "active", "invalid_execute", "second_execute"])
    if state == "invalid_execute":
        variant = s.rng.choice(sorted(INVALID_EXECUTES))
        s.tally.count(s.tally.variants, f"hostile:invalid_execute:{variant}")
        exec_id = s.next_id()
        host.send(INVALID_EXECUTES[variant] % (exec_id.encode(), invalid_options(variant)))
        done = host.receive(f"the validation_error done of {exec_id}")
        if done is None or done.get("type") != "done" or done.get("id") != exec_id:
            raise Violation(f"{variant}: expected done validation_error for {exec_id}, got {done or host.ended()}")
        expect(done, "validation_error")
        run_ok_logs(s, host)  # the connection stays usable
        host.finish()
        return
    if state == "second_execute":
        s.tally.count(s.tally.variants, "hostile:second_execute")
        first, second = s.next_id(), s.next_id()

        def intrude(call: dict[str, Any]) -> None:
            host.send(execute_message(second, "1", OPTIONS, MANIFEST))
            answer = host.receive(f"the done of the second execute {second}")
            if answer is None or answer.get("type") != "done" or answer.get("id") != second:
                raise Violation(f"expected done internal_error for {second}, got {answer or host.ended()}")
            expect(answer, "internal_error")
            host.echo(call)

        expect(host.execute(first, "(await tools.echo({v: 7})).v", on_tool_call=intrude), None, 7)
        host.finish()
        return
    frames = IDLE_FRAMES if state == "idle" else ACTIVE_FRAMES
    name = s.rng.choice(sorted(frames))
    frame, close_code = frames[name]
    s.tally.count(s.tally.variants, f"hostile:{state}:{name}")
    active_id: str | None = None
    if state == "active":
        active_id = s.next_id()
        host.send(execute_message(active_id, "await tools.hang({})", {**OPTIONS, "timeoutMs": 30_000}, MANIFEST))
        for wanted in ("started", "tool_call"):
            message = host.receive(f"the {wanted} of {active_id}")
            if message is None or message.get("type") != wanted:
                raise Violation(f"expected {wanted}, got {message or host.ended()}")
    host.send(frame, binary=name == "binary")
    messages = host.until_closed(f"the answer to {name} ({state})")
    got = host.client.ws.close_rcvd
    assert got is not None  # until_closed checked it
    expected = [] if active_id is None else [(active_id, "validation_error")]
    answered = [(m.get("id"), (m.get("error") or {}).get("code")) for m in messages if m.get("type") == "done"]
    if len(messages) != len(expected) or answered != expected or got.code != close_code:
        raise Violation(
            f"{name} ({state}): expected {expected} then close {close_code}, got {messages} then {host.ended()}"
        )
    if active_id is not None:
        s.tally.count(s.tally.dones, "validation_error")


def park_long(s: Session, host: Host, seconds: float) -> None:
    """An innocent neighbour: one execution parked on a tool for ``seconds``, then answered; it must end ok."""
    timeout_ms = int(seconds * 1000) + 30_000
    done = host.execute(
        s.next_id(),
        "(await tools.echo({v: 1})).v",
        {**OPTIONS, "timeoutMs": timeout_ms},
        lambda c: host.echo(c, seconds),
    )
    expect(done, None, 1)
    host.finish()


def single(kind: str) -> Callable[[Session, Host], None]:
    """A session of one execution of ``kind``, then the closing handshake."""

    def session(s: Session, host: Host) -> None:
        EXECUTIONS[kind](s, host)
        host.finish()

    return session


SESSIONS: Final[dict[str, tuple[int, Callable[[Session, Host], None]]]] = {
    "ok_logs": (12, single("ok_logs")),
    "tools": (12, single("tools")),
    "tool_error": (8, single("tool_error")),
    "throw": (8, single("throw")),
    "memory_bomb": (5, single("memory_bomb")),
    "timeout": (6, single("timeout")),
    "cancel_parked": (6, single("cancel_parked")),
    "cancel_spinning": (5, single("cancel_spinning")),
    "slow_tools": (6, single("slow_tools")),
    "sequence": (8, sequence),
    "disconnect": (8, disconnect),
    "hostile": (12, hostile),
}


def run_session(
    kind: str, body: Callable[[Session, Host], None], s: Session, uri: WebSocketURI, limit_s: float = SESSION_LIMIT_S
) -> None:
    """One session of ``kind``; a broken invariant is counted and described, never raised."""
    s.tally.count(s.tally.sessions, kind)
    host: Host | None = None
    try:
        host = Host(uri, s.tally, time.monotonic() + limit_s)
        body(s, host)
    except Violation as exc:
        detail = f"{exc}; last frames: {host.transcript}" if host else str(exc)
        s.tally.count(s.tally.session_violations, kind)
        s.tally.violation(f"{kind} {s.prefix}", detail)
    except ConnectionError as exc:
        if "HTTP 503" in str(exc):
            with s.tally.lock:
                s.tally.refused += 1
            time.sleep(0.1)
            return
        s.tally.count(s.tally.session_violations, kind)
        s.tally.violation(f"{kind} {s.prefix}", f"{type(exc).__name__}: {exc}; last frames: {host and host.transcript}")
    except (OSError, ValueError) as exc:  # a reset by the runner, a timed-out handshake, a protocol error
        s.tally.count(s.tally.session_violations, kind)
        s.tally.violation(f"{kind} {s.prefix}", f"{type(exc).__name__}: {exc}; last frames: {host and host.transcript}")
    finally:
        if host is not None:
            host.client.sock.close()


def client_loop(
    index: int, uri: WebSocketURI, kinds: list[str], seed: int, end: float, stop: threading.Event, tally: Tally
) -> None:
    """Sessions drawn from the seeded mix of ``kinds``, back to back, until ``end``."""
    rng = random.Random(f"{seed}:{index}")
    weights = [SESSIONS[kind][0] for kind in kinds]
    number = 0
    while time.monotonic() < end and not stop.is_set():
        kind = rng.choices(kinds, weights)[0]
        run_session(kind, SESSIONS[kind][1], Session(rng, f"c{index}s{number}", tally), uri)
        number += 1


def sentinel_loop(index: int, uri: WebSocketURI, start: float, end: float, tally: Tally) -> None:
    """Executions parked for up to ``PARK_S`` each, back to back from ``start`` until ``end``."""
    time.sleep(max(start - time.monotonic(), 0.0))
    number = 0
    while (left := end - time.monotonic()) > 5.0:
        seconds = min(PARK_S, left)
        session = Session(random.Random(index), f"p{index}s{number}", tally)
        run_session(
            "parked_long", functools.partial(park_long, seconds=seconds), session, uri, seconds + SESSION_LIMIT_S
        )
        number += 1


# ---------------------------------------------------------------- the daemon, watched every second


def healthz(uri: WebSocketURI) -> dict[str, Any]:
    """``GET /healthz``; raises ``Violation`` on anything but a 200 with ``status: alive``."""
    connection = http.client.HTTPConnection(uri.host, uri.port, timeout=HEALTH_TIMEOUT_S)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise Violation(f"/healthz did not answer: {type(exc).__name__}: {exc}") from None
    finally:
        connection.close()
    try:
        report = json.loads(body)
    except ValueError:
        report = {}
    if response.status != 200 or report.get("status") != "alive":
        raise Violation(f"/healthz answered {response.status} {body[:200]!r}")
    return report  # type: ignore[no-any-return]


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


@dataclass
class Watch:
    """Samples taken every second: (seconds into the run, tree RSS), and health figures."""

    uri: WebSocketURI
    pid: int | None
    tally: Tally
    t0: float
    rss: list[tuple[float, int]] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)  # live processes under the daemon
    health_ms: list[float] = field(default_factory=list)
    dead: threading.Event = field(default_factory=threading.Event)

    def once(self) -> None:
        if self.pid is not None:
            if not alive(self.pid):
                self.tally.violation("daemon", f"process {self.pid} is gone")
                self.dead.set()
                return
            self.rss.append((time.monotonic() - self.t0, tree_rss_bytes(self.pid)))
            self.processes.append(tree_cpu_seconds(self.pid)[2])
        started = time.perf_counter()
        try:
            healthz(self.uri)
        except Violation as exc:
            self.tally.violation("healthz", str(exc))
        self.health_ms.append((time.perf_counter() - started) * 1000)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_EVERY_S) and not self.dead.is_set():
            self.once()


def slope_mib_per_min(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over time, MiB a minute (NaN for fewer than 2 points)."""
    if len(points) < 2:
        return float("nan")
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return float("nan")
    return sum((t - mean_t) * (r - mean_r) for t, r in points) / spread * 60 / MiB


def settle(uri: WebSocketURI, tally: Tally) -> int | None:
    """After the load, wait (bounded) until ``/healthz`` shows no session five times in a row; the last
    count (None when ``/healthz`` is the bare one, with ``--metrics-port``)."""
    zeros, sessions, end = 0, None, time.monotonic() + SETTLE_S
    while time.monotonic() < end and zeros < 5:
        try:
            report = healthz(uri)
        except Violation as exc:
            tally.violation("healthz", str(exc))
            return None
        if "sessions" not in report:
            return None
        sessions = report["sessions"]
        zeros = zeros + 1 if sessions == 0 else 0
        time.sleep(0.2)
    if zeros < 5:
        tally.violation("sessions", f"/healthz still counts {sessions} sessions {SETTLE_S:g} s after the load stopped")
    return sessions


# ---------------------------------------------------------------- the run and its report


def show(name: str, ms: list[float]) -> None:
    if not ms:
        print(f"  {name:<36} no samples")
        return
    print(
        f"  {name:<36} n={len(ms):<5} p50 {percentile(ms, 0.5):7.1f}  p99 {percentile(ms, 0.99):7.1f}"
        f"  max {max(ms):7.1f} ms"
    )


def soak(uri: WebSocketURI, pid: int | None, args: argparse.Namespace) -> int:
    """Run the soak; print the figures; the number of violations."""
    tally = Tally(shown=args.show)
    t0 = time.monotonic()
    watch = Watch(uri, pid, tally, t0)
    watch.once()
    end = t0 + args.duration
    stop = threading.Event()
    threads = [
        threading.Thread(target=client_loop, args=(i, uri, args.kinds, args.seed, end, stop, tally), daemon=True)
        for i in range(args.clients)
    ]
    threads += [
        threading.Thread(
            target=sentinel_loop, args=(i, uri, t0 + i * PARK_S / max(args.sentinels, 1), end, tally), daemon=True
        )
        for i in range(args.sentinels)
    ]
    watcher = threading.Thread(target=watch.run, args=(stop,), daemon=True)
    print(
        f"soak: {args.duration:g} s, {args.clients} clients + {args.sentinels} sentinels, seed {args.seed}, {uri.host}:{uri.port}, daemon pid {pid}"
    )
    watcher.start()
    for thread in threads:
        thread.start()
    while time.monotonic() < end and not watch.dead.is_set():
        time.sleep(min(PROGRESS_EVERY_S, max(end - time.monotonic(), 0.0)))
        rss = f", tree RSS {watch.rss[-1][1] / MiB:.0f} MiB" if watch.rss else ""
        print(
            f"  {time.monotonic() - t0:5.0f} s: {sum(tally.sessions.values())} sessions,"
            f" {tally.violations} violations{rss}",
            flush=True,
        )
    stop.set()
    joined_by = time.monotonic() + PARK_S + SESSION_LIMIT_S + IO_TIMEOUT_S  # a session's limit plus one read
    for thread in threads:
        thread.join(timeout=max(joined_by - time.monotonic(), 0.0))
    stuck = sum(thread.is_alive() for thread in threads)
    if stuck:
        tally.violation("soak", f"{stuck} client threads still running after the load stopped")
    wall = time.monotonic() - t0
    sessions_left = settle(uri, tally) if not watch.dead.is_set() else None
    idle_cpu = float("nan")
    if pid and not watch.dead.is_set():
        own0, tree0, _ = tree_cpu_seconds(pid)
        time.sleep(3.0)
        own1, tree1, _ = tree_cpu_seconds(pid)
        idle_cpu = (own1 + tree1 - own0 - tree0) / 3.0 * 100
        watch.once()  # the end figures, after the load

    total = sum(tally.sessions.values())
    print(f"\nsessions: {total} in {wall:.0f} s ({total / wall:.1f}/s), refused (503): {tally.refused}")
    for kind in sorted(tally.sessions):
        print(f"  {kind:<16} {tally.sessions[kind]:6}   violations {tally.session_violations[kind]}")
    print("variants: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.variants.items())))
    print("dones by outcome: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.dones.items())))
    print("latency (ms):")
    for name in sorted(tally.samples_ms):
        show(name, tally.samples_ms[name])
    show("GET /healthz", watch.health_ms)
    if watch.rss:
        sizes = [r for _, r in watch.rss]
        half = [(t, r) for t, r in watch.rss if args.duration / 2 <= t <= args.duration]
        print(
            f"tree RSS (daemon, zygotes, workers): start {sizes[0] / MiB:.0f} MiB, peak {max(sizes) / MiB:.0f} MiB,"
            f" end {sizes[-1] / MiB:.0f} MiB (after the load); slope over the second half"
            f" {slope_mib_per_min(half):+.2f} MiB/min ({len(half)} samples)"
        )
        print(
            f"processes under the daemon: start {watch.processes[0]}, peak {max(watch.processes)},"
            f" end {watch.processes[-1]}; tree CPU after the load {idle_cpu:.1f}% of a core"
        )
    print(f"sessions open after the load (/healthz): {sessions_left}")
    print(f"violations: {tally.violations}")
    for line in tally.described:
        print(f"  {line}")
    return tally.violations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of load (default 120)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent host connections (default 32)")
    parser.add_argument(
        "--sentinels", type=int, default=2, help=f"executions kept parked {PARK_S:g} s at a time (default 2)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the session mix (default 1)")
    parser.add_argument(
        "--kinds", type=lambda text: sorted(text.split(",")), default=sorted(SESSIONS), help="a subset of the mix"
    )
    parser.add_argument("--show", type=int, default=10, help="violations described in full (default 10)")
    parser.add_argument("--url", help="a running daemon (127.0.0.1) instead of starting one")
    parser.add_argument("--daemon-pid", type=int, help="with --url: its PID, for liveness and RSS")
    parser.add_argument("--daemon-arg", action="append", default=[], help="passed on to the daemon started here")
    args = parser.parse_args()
    if unknown := set(args.kinds) - set(SESSIONS):
        parser.error(f"unknown --kinds {sorted(unknown)}; known: {','.join(sorted(SESSIONS))}")
    server = None if args.url else start_daemon(extra_args=args.daemon_arg)
    try:
        uri = parse_uri(args.url or server.url)  # type: ignore[union-attr]
        if uri.host not in ("127.0.0.1", "localhost", "::1"):
            parser.error("the soak runs against a loopback daemon only")
        if server is not None:
            time.sleep(1.0)  # the warm workers start
        pid = server.process.pid if server is not None else args.daemon_pid
        violations = soak(uri, pid, args)
    finally:
        if server is not None:
            server.stop()
    raise SystemExit(1 if violations else 0)


if __name__ == "__main__":
    main()
