"""What the soak's hosts do: executions on an open connection, and sessions (a connection each)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, Final

from execbox_runner.protocol.messages import ERROR_CODES

from .host import OPTIONS, Host, Session, Violation, cancel_message, execute_message, expect, tool_code, tool_sum

MiB: Final = 1 << 20
STABLE_CODES: Final = ERROR_CODES  # what a failing tool_result's code stays as; any other is tool_error

# ---------------------------------------------------------------- executions (on an open connection)


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
        host.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": False, "error": error}))

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
    host.send(execute_message(exec_id, code.get(at, "await tools.hang({})"), {**OPTIONS, "timeoutMs": 30_000}))
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
            host.send(execute_message(second, "1"))
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
        host.send(execute_message(active_id, "await tools.hang({})", {**OPTIONS, "timeoutMs": 30_000}))
        for wanted in ("started", "tool_call"):
            message = host.receive(f"the {wanted} of {active_id}")
            if message is None or message.get("type") != wanted:
                raise Violation(f"expected {wanted}, got {message or host.ended()}")
    host.send(frame, binary=name == "binary")
    messages = host.until_closed(f"the answer to {name} ({state})")
    expected = [] if active_id is None else [(active_id, "validation_error")]
    answered = [(m.get("id"), (m.get("error") or {}).get("code")) for m in messages if m.get("type") == "done"]
    if len(messages) != len(expected) or answered != expected or host.close_code() != close_code:
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
