"""One host connection of the soak, what the soak counts, and the check of a ``done``."""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from execbox_runner_conformance.connection import Connection, connect
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

IO_TIMEOUT_S: Final = 10.0  # any single read; nothing may hang
OPTIONS: Final[dict[str, int]] = {
    "timeoutMs": 5000,
    "memoryLimitBytes": 64 << 20,
    "maxLogLines": 100,
    "maxLogChars": 64000,
}
# The host answers ``echo`` with its input and never answers ``hang``.
PROVIDERS: Final = [
    {"name": "tools", "tools": {n: {"safeName": n, "originalName": n} for n in ("echo", "hang")}, "types": ""}
]


class Violation(Exception):
    """A broken invariant; the message says what was sent and what came back."""


def execute_message(exec_id: str, code: str, options: dict[str, int] = OPTIONS) -> str:
    return json.dumps({"type": "execute", "id": exec_id, "code": code, "options": options, "providers": PROVIDERS})


def cancel_message(exec_id: str) -> str:
    return json.dumps({"type": "cancel", "id": exec_id})


def tool_code(n: int) -> str:
    """A guest making ``n`` sequential ``echo`` calls; its result is ``tool_sum(n)``."""
    return f"let s = 0; for (let i = 0; i < {n}; i++) s += (await tools.echo({{v: i}})).v; s"


def tool_sum(n: int) -> int:
    return n * (n - 1) // 2


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


@dataclass
class Session:
    """One session's context: its random source, id prefix, counts and bearer token (if any)."""

    rng: random.Random
    prefix: str
    tally: Tally
    token: str | None = None
    executions: int = 0

    def next_id(self) -> str:
        self.executions += 1
        return f"{self.prefix}e{self.executions}"


class Host:
    """One host connection (the conformance kit's one-thread ``Connection``) and a short transcript."""

    def __init__(self, url: str, tally: Tally, deadline: float, token: str | None = None) -> None:
        headers = [("Authorization", f"Bearer {token}")] if token else []
        self.connection: Connection = connect(
            url, additional_headers=headers, open_timeout=IO_TIMEOUT_S, close_timeout=IO_TIMEOUT_S
        )
        self.tally = tally
        self.deadline = deadline
        self.transcript: list[str] = []
        self.t0 = time.monotonic()

    def note(self, line: str) -> None:
        """Keep the last frames, each with its time since the connection opened."""
        self.transcript = [*self.transcript[-5:], f"+{time.monotonic() - self.t0:.2f}s {line[:160]}"]

    def send(self, data: str | bytes, binary: bool = False) -> None:
        """A text frame (``bytes`` are sent unchecked, invalid UTF-8 included), or a binary one."""
        self.note(f"> {data[:140]!r}{' (binary)' if binary else ''}")
        self.connection.send(data, text=not binary)

    def receive(self, waiting_for: str) -> dict[str, Any] | None:
        """The next runner message; None once the connection has ended."""
        if time.monotonic() > self.deadline:
            raise Violation(f"session past its time limit, waiting for {waiting_for}")
        try:
            text = self.connection.recv(IO_TIMEOUT_S)
        except ConnectionClosed:
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

    def close_code(self) -> int | None:
        """The code of the runner's close frame, None if none came."""
        close = self.connection.protocol.close_rcvd
        return None if close is None else close.code

    def ended(self) -> str:
        """How the connection ended, as the runner closed it."""
        close = self.connection.protocol.close_rcvd
        return "a bare TCP close (no close frame)" if close is None else f"close {close.code} {close.reason!r}"

    def execute(
        self,
        exec_id: str,
        code: str,
        options: dict[str, int] = OPTIONS,
        on_tool_call: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Send an accepted ``execute``; answer its tool calls; return its one ``done``."""
        self.send(execute_message(exec_id, code, options))
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
        self.send(json.dumps(reply))

    def until_closed(self, waiting_for: str) -> list[dict[str, Any]]:
        """Every message until the runner's close; that close must be a close frame."""
        messages = []
        while (message := self.receive(waiting_for)) is not None:
            messages.append(message)
        if self.close_code() is None:
            raise Violation(f"{waiting_for}: got a bare TCP close (no close frame) after {messages}")
        return messages

    def finish(self) -> None:
        """The host's closing handshake: nothing may arrive after the last ``done``, and the runner answers."""
        protocol = self.connection.protocol
        if protocol.state is State.OPEN:
            protocol.send_close(1000)
            for data in protocol.data_to_send():
                self.connection.socket.sendall(data)
        stray = self.until_closed("the answer to our close")
        if stray:
            raise Violation(f"messages after the last done: {stray}")

    def abort(self, reset: bool) -> None:
        """Vanish: a TCP RST (``SO_LINGER`` 0), or a plain close with no close frame."""
        if reset:
            self.connection.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.socket.close()


def expect(done: dict[str, Any], code: str | None, result: Any = ..., logs: list[str] | None = None) -> None:
    """``done`` is ``ok`` (``code`` None, with ``result`` unless ...) or failed with ``code``."""
    error = done.get("error") or {}
    if code is None and (done.get("ok") is not True or (result is not ... and done.get("result") != result)):
        raise Violation(f"expected ok with result {result!r}, got {done}")
    if code is not None and (done.get("ok") is not False or error.get("code") != code):
        raise Violation(f"expected {code}, got {done}")
    if logs is not None and done.get("logs") != logs:
        raise Violation(f"expected logs {logs}, got {done.get('logs')}")
