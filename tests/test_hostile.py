"""A hostile-guest corpus against the real daemon: every execution gets its done,
the daemon survives, and nothing leaks (descriptors, processes)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from execbox_runner.daemon.pool.worker import STUCK_KILL_S
from execbox_runner.daemon.server import ABANDON_GRACE_S
from execbox_runner.worker.guest import MAX_MESSAGE_CHARS

from .daemonkit import (
    Daemon,
    client,
    cpu_ticks,
    execute,
    receive,
    run_to_done,
    running_daemon,
)

MEMORY = 16 << 20
CORPUS: dict[str, tuple[str, set[str]]] = {
    # memory bombs of several shapes
    "array_growth": ("const a = []; while (true) a.push(new Array(1000).fill(a.length))", {"memory_limit"}),
    "string_doubling": ("let s = 'x'; while (true) s += s", {"memory_limit", "runtime_error"}),
    "object_graph": ("let o = {}; for (let i = 0; ; i++) o = { next: o, pad: [i, i, i, i] }", {"memory_limit"}),
    "typed_array": ("new Uint8Array(1e9)", {"memory_limit", "runtime_error"}),
    "map_growth": ("const m = new Map(); for (let i = 0; ; i++) m.set(i, { i })", {"memory_limit"}),
    "small_strings": (
        "const s = []; for (let i = 0; ; i++) s.push('x'.repeat(64) + i)",
        {"memory_limit", "runtime_error"},
    ),
    "nested_bomb": (
        "function f() { const a = []; while (true) a.push({ a: [1, 2, 3] }) } f()",
        {"memory_limit", "runtime_error"},
    ),
    # stack exhaustion
    "recursion": ("function f(n) { return f(n + 1) + 1 } f(0)", {"runtime_error"}),
    "mutual_recursion": ("const a = (n) => b(n) + 1; const b = (n) => a(n) + 1; a(0)", {"runtime_error"}),
    "deep_result": (
        "let v = []; for (let i = 0; i < 100000; i++) v = [v]; v",
        {"serialization_error", "runtime_error"},
    ),
    # Parses (the guest has Node's stack depth), and a value 100,000 levels deep cannot be returned.
    "deep_json_parse": (
        "JSON.parse('['.repeat(100000) + ']'.repeat(100000))",
        {"runtime_error", "memory_limit", "serialization_error"},
    ),
    # log floods
    "log_flood": ("for (let i = 0; i < 200000; i++) console.log('flood', i); 1", {"ok"}),
    "log_huge_lines": ("const s = 'y'.repeat(1 << 20); for (let i = 0; i < 100; i++) console.log(s); 1", {"ok"}),
    # promise and job storms
    "microtask_storm": (
        "const spin = () => Promise.resolve().then(spin); spin(); await new Promise(() => {})",
        {"timeout"},
    ),
    "promise_all_storm": (
        "await Promise.all(Array.from({ length: 200000 }, (_, i) => Promise.resolve(i))); 1",
        {"ok", "memory_limit", "runtime_error"},
    ),
    "queue_microtask_storm": (
        "const again = () => queueMicrotask(again); again(); await new Promise(() => {})",
        {"timeout"},
    ),
    # 2,000 round trips in the corpus's 1.5 s: a loaded machine may need longer (timeout).
    "tool_call_flood": (
        "await Promise.all(Array.from({ length: 2000 }, (_, i) => tools.echo(i))); 1",
        {"ok", "timeout"},
    ),
    # huge strings and results
    "huge_result": ("'z'.repeat(20 << 20)", {"serialization_error", "memory_limit"}),
    "huge_tool_input": ("await tools.echo('q'.repeat(20 << 20))", {"serialization_error", "memory_limit"}),
    # time
    "spin": ("while (true) {}", {"timeout"}),
    "spin_in_catch": ("try { throw 1 } catch { while (true) {} }", {"timeout"}),
    "spin_after_tool": ("await tools.echo(1); for (;;) {}", {"timeout"}),
    "atomics_wait": ("Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); 1", {"timeout", "runtime_error"}),
    # tampering with what the bootstrap relies on
    "tamper_builtins": (
        """Object.defineProperty = () => { throw 1 }; Map.prototype.get = () => { throw 2 }; Map.prototype.set = () => { throw 3 };
        JSON.stringify = () => '"forged"'; JSON.parse = () => ({ forged: true }); Promise.prototype.then = function () { throw 4 };
        Function.prototype.call = function () { throw 5 }; Function.prototype.apply = function () { throw 6 };
        Array.prototype[Symbol.iterator] = function* () { yield 'forged' }; String.prototype.slice = () => 'forged';
        Object.defineProperty(Object.prototype, 'then', { get() { throw 7 } });
        const r = await tools.echo({ a: [1, 2] }); console.log('after'); r""",
        {"ok", "runtime_error"},
    ),
    "tamper_error_classification": (
        "Error.isError = () => true; Object.getPrototypeOf = () => null; throw new Error('out of memory')",
        {"runtime_error"},
    ),
}


@pytest.fixture(scope="module", params=["standard", "hardened"])
def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
    with running_daemon("--profile", request.param, "--warm-workers", "2", "--max-output-bytes", str(8 << 20)) as d:
        yield d


def settled_descriptors(daemon: Daemon) -> list[str]:
    """The daemon's descriptors once its pool has stopped changing: the same workers and count
    over half a second (for 10 s at most). An execution's lease makes the pool start a worker to
    keep its warm ones idle, and that worker's channel and pidfd belong to the daemon from then on."""
    last = (daemon.descriptors(), daemon.workers())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = (daemon.descriptors(), daemon.workers())
        if (len(now[0]), now[1]) == (len(last[0]), last[1]):
            break
        last = now
    return last[0]


def test_the_corpus_cannot_hurt_the_daemon(daemon: Daemon) -> None:
    with client(daemon.url) as ws:
        run_to_done(ws, "warm-up", "1")
    before = settled_descriptors(daemon)
    outcomes: dict[str, str] = {}
    for name, (code, expected) in CORPUS.items():
        started = time.monotonic()
        with client(daemon.url) as ws:
            # Guests that end on a limit of their own get room to reach it on a loaded machine; the
            # time limit stays short for those expected to meet it.
            timeout_ms = 1500 if "timeout" in expected else 8000  # (each message is awaited 10 s)
            done = run_to_done(ws, name, code, timeoutMs=timeout_ms, memoryLimitBytes=MEMORY, maxLogChars=100_000)
        outcomes[name] = "ok" if done["ok"] else done["error"]["code"]
        assert outcomes[name] in expected, (name, done.get("error"))
        assert time.monotonic() - started < 30, name
        assert daemon.process.poll() is None, f"the daemon died on {name}"
    # Still serving, and nothing left behind.
    with client(daemon.url) as ws:
        assert run_to_done(ws, "after", "await tools.echo(41) + 1")["result"] == 42
    after = daemon.descriptors_within(len(before), timeout=20)
    assert len(after) <= len(before), ("the daemon leaked file descriptors", before, after)
    deadline = time.monotonic() + 20
    while len(workers := daemon.workers()) > 2 + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(workers) <= 4, ("worker processes were left behind", workers)


def test_only_the_hardened_profile_retires_a_worker_after_one_execution(daemon: Daemon) -> None:
    with client(daemon.url) as ws:
        before = {pid: cpu_ticks(pid) for pid in daemon.workers()}
        # A generous timeout: under a loaded machine the burn must still end as ok, not as a timeout.
        code = "let s = 0; for (let i = 0; i < 3e7; i++) s += i; await tools.echo(1); s"
        ws.send(execute("burn", code, timeoutMs=60_000))
        assert receive(ws)["type"] == "started"
        call = receive(ws, timeout=60)
        # The worker that burned CPU is the one running this execution.
        ran = max(daemon.workers(), key=lambda pid: cpu_ticks(pid) - before.get(pid, 0))
        ws.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 1}))
        done = receive(ws)
        assert done["type"] == "done" and done["ok"], done
    profile = daemon.process.args[daemon.process.args.index("--profile") + 1]  # type: ignore[union-attr]
    if profile == "standard":
        time.sleep(0.5)
        assert ran in daemon.workers(), "a standard worker is kept for the next execution"
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and ran in daemon.workers():
        time.sleep(0.05)
    assert ran not in daemon.workers(), "a hardened worker must not outlive its execution"


def test_a_huge_error_message_is_cut_and_fails_no_other_execution() -> None:
    """What a guest throws, or a getter throws as its result is read, is a message it chooses the size
    of: it is cut to MAX_MESSAGE_CHARS characters, so the worker's frame stays within its bound, and
    another session's execution on the same worker runs on (a frame past it would lose the worker)."""
    args = ("--max-output-bytes", "1024", "--warm-workers", "1", "--max-workers", "1")
    with running_daemon(*args) as d, client(d.url) as other, client(d.url) as ws:
        other.send(execute("victim", "await tools.echo(1) + 1"))
        assert receive(other)["type"] == "started"
        call = receive(other)
        thrown = run_to_done(ws, "thrown", "throw new Error('x'.repeat(2e6))")
        got = run_to_done(ws, "got", "({ get g() { throw { message: 'y'.repeat(2e6) } } })")
        other.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 1}))
        assert receive(other)["result"] == 2
    assert thrown["error"] == {"code": "runtime_error", "message": "x" * MAX_MESSAGE_CHARS}
    prefix = "Guest code returned a non-serializable value: reading it threw: "
    expected = prefix + "y" * (MAX_MESSAGE_CHARS - len(prefix))
    assert got["error"] == {"code": "serialization_error", "message": expected}


def test_a_guest_that_catches_rejections_of_oversized_inputs_fails_no_other_execution() -> None:
    """Each round sends one input and has a second, too big beside it, rejected: the guest's next
    round is in the same report to the daemon. Four rounds made a frame past the daemon's bound on
    a worker's (``ipc.max_frame``), and the daemon lost the worker, failing every
    execution on it with internal_error."""
    args = ("--max-output-bytes", str(2 << 20), "--warm-workers", "1", "--max-workers", "1")
    code = """const s = 'x'.repeat(1.8 * (1 << 20));
    for (let i = 0; i < 4; i++) { tools.echo(s); try { await tools.echo(s) } catch (e) { console.log(i, e.code) } }
    'end'"""
    with running_daemon(*args) as d, client(d.url) as other, client(d.url) as ws:
        other.send(execute("victim", "await tools.echo(1) + 1"))
        assert receive(other)["type"] == "started"
        call = receive(other)
        ws.send(execute("rounds", code, timeoutMs=60_000, memoryLimitBytes=256 << 20))
        messages = [receive(ws, timeout=60)]
        while messages[-1]["type"] != "done":
            messages.append(receive(ws, timeout=60))
        other.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 1}))
        assert receive(other)["result"] == 2
    *sent, done = messages
    assert [(m["type"], len(m.get("input", ""))) for m in sent] == [("started", 0), ("tool_call", int(1.8 * (1 << 20)))]
    assert (done["ok"], done.get("result")) == (True, "end"), done.get("error")
    assert done["logs"] == [f"{i} serialization_error" for i in range(4)]


def test_megabytes_of_code_hold_up_no_other_execution_of_the_worker() -> None:
    """tree-sitter, which normalizes the code, holds the GIL while it parses: seconds for these 8 MB,
    during which every other execution of the worker waited (the next ones timed out), and a
    cancel could not stop it. It reads the code a piece at a time, and stops at a cancel."""
    code = "[" + "1," * 4_000_000 + "]"
    with running_daemon("--warm-workers", "1", "--max-workers", "1") as d, client(d.url) as big, client(d.url) as ws:
        big.send(execute("big", code, timeoutMs=60_000, memoryLimitBytes=256 << 20))
        assert receive(big)["type"] == "started"
        dones = []
        until = time.monotonic() + 4  # past the start of the parse, which compiling the code precedes
        while time.monotonic() < until:
            dones.append(run_to_done(ws, f"small-{len(dones)}", "1 + 1", timeoutMs=3000))
        big.send(json.dumps({"type": "cancel", "id": "big"}))
        cancelled = receive(big)
    assert [done.get("result", done.get("error")) for done in dones] == [2] * len(dones)
    assert cancelled["error"]["code"] == "timeout", cancelled["error"]


def test_a_worker_stuck_in_an_aborted_execution_is_killed_only_once_its_other_executions_end() -> None:
    """Some built-ins run a loop the interrupt cannot stop (a splice over 2**32 - 1 holes): the worker
    still holds the aborted execution STUCK_KILL_S after its grace, and was then killed with every
    execution it hosted (internal_error for a host whose tool took 35 s). It takes no new ones, and
    is killed once those it hosts have ended."""
    args = ("--warm-workers", "1", "--max-workers", "1")
    stuck = "const a = []; a.length = 2 ** 32 - 1; a.splice(0, 1); 1"
    with running_daemon(*args) as d, client(d.url) as other, client(d.url) as ws:
        other.send(execute("victim", "await tools.echo(1) + 1", timeoutMs=120_000))
        assert receive(other)["type"] == "started"
        call = receive(other)
        (worker,) = d.workers()
        assert run_to_done(ws, "stuck", stuck, timeoutMs=200)["error"]["code"] == "timeout"
        time.sleep(ABANDON_GRACE_S + STUCK_KILL_S + 2)  # past the time a stuck worker is killed at
        assert worker in d.workers(), "the worker was killed while it hosted the victim"
        other.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 1}))
        assert receive(other)["result"] == 2
        deadline = time.monotonic() + 10
        while worker in d.workers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker not in d.workers(), "the stuck worker outlived its last execution"
        assert run_to_done(ws, "after", "6 * 7")["result"] == 42
        lines = d.json_lines(lambda lines: any(line.get("exit_reason") == "stuck" for line in lines))
    assert [line["executions_held"] for line in lines if line.get("exit_reason") == "stuck"] == [1]
