"""What a parked execution costs a worker, and that a worker gives memory back when executions end
(issue 9: memory per parked execution)."""

from __future__ import annotations

import threading

import pytest
import quickjs

from execbox_runner.protocol import ipc
from execbox_runner.worker import guest as guest_module
from execbox_runner.worker import memory_limit, native
from execbox_runner.worker.guest import GuestRun
from execbox_runner.worker.runtime import fresh_runtime

from .guestkit import run, run_message, value
from .test_sandbox import receive, receive_any, start_worker

PARKED = "const r = await tools.slow({}); r + 1"
SLOW = [("tools", ["slow"])]
KIB = 1 << 10
MIB = 1 << 20


def parked(code: str = PARKED) -> GuestRun:
    """A guest awaiting its tool call, id 1."""
    guest = GuestRun(run_message(code, providers=SLOW, budget=60))
    out = guest.start()
    assert isinstance(out, ipc.ToolCalls) and [call[0] for call in out.calls] == [1]
    return guest


def test_the_bootstrap_keeps_no_source_text_and_the_guests_own_functions_keep_theirs() -> None:
    code = "[String(console.log), String(tools.echo), String(queueMicrotask), String(function f() { return 1 })]"
    log, tool, microtask, own = value(run(code))
    for text in (log, tool, microtask):
        assert text.endswith("() {\n    [native code]\n}"), text
    assert own == "function f() { return 1 }"


@pytest.mark.skipif(not native.SUPPORTED, reason="the bootstrap is compiled only where the native layout holds")
def test_the_bootstrap_adds_little_to_a_fresh_runtime() -> None:
    """A guard on bootstrap.js: what it adds to every runtime's heap, beside QuickJS's own context.

    QuickJS counts ~97 KiB for a bare context (in ~164 KiB of its 4 KiB arenas); the bootstrap
    added ~52 KiB before its source text was dropped and its error recorders shared one handler,
    ~41 KiB before it bound fewer methods and built fewer functions and objects (~32 KiB).
    """
    bare = quickjs.Context().memory()["malloc_size"]
    prepared = fresh_runtime().context.memory()["malloc_size"]
    assert prepared - bare <= 36 * KIB, (prepared - bare) / KIB


def test_a_finished_execution_frees_its_runtime_at_once() -> None:
    guest = parked()
    assert guest.memory.used > 64 * KIB
    finished = guest.settle(ipc.Settle(call_id=1, ok=True, value=b"41"))
    assert isinstance(finished, ipc.Finished) and finished.result == b"42"
    assert not hasattr(guest, "context") and not hasattr(guest, "api")  # QuickJS freed it
    assert guest.memory.used == 0
    assert guest.interrupt() is False
    # Whatever arrives late for it is answered from the outcome, never from the freed engine.
    assert guest.settle(ipc.Settle(call_id=1, ok=True, value=b"1")) is finished
    assert guest.step() is finished and guest.abort() is finished and guest.evict() is finished


def test_an_aborted_or_evicted_parked_execution_frees_its_runtime() -> None:
    aborted, evicted = parked("try { await tools.slow(1) } finally { console.log('bye') }"), parked()
    assert (aborted.abort().logs, evicted.evict().code) == (["bye"], "memory_limit")
    for guest in (aborted, evicted):
        assert not hasattr(guest, "context") and guest.memory.used == 0


def test_heaps_can_be_read_from_another_thread_while_runtimes_are_freed() -> None:
    """The worker's reading thread answers Measure while runner threads end executions."""
    guests = [parked() for _ in range(60)]
    stop = threading.Event()
    readings: list[int] = []

    def measure() -> None:
        while True:
            done = stop.is_set()  # read first: the last reading starts after every runtime is freed
            readings.append(sum(guest.memory.used for guest in guests))
            if done:
                return

    reader = threading.Thread(target=measure)
    reader.start()
    try:
        for guest in guests:
            assert isinstance(guest.settle(ipc.Settle(call_id=1, ok=True, value=b"1")), ipc.Finished)
    finally:
        stop.set()
        reader.join()
    assert readings and readings[-1] == 0 and sum(guest.memory.used for guest in guests) == 0


def test_the_heap_is_trimmed_only_when_the_worker_shrinks() -> None:
    runtime = 150 * KIB  # what QuickJS counts for a parked execution

    def ends(shrinking: guest_module._Shrinking, count: int) -> int:
        return sum(shrinking.ended(runtime) for _ in range(count))

    burst = guest_module._Shrinking()
    for _ in range(2000):
        burst.started()
    trims = ends(burst, 2000)
    assert 5 <= trims <= 20  # each gives back tens of MiB, none hundreds
    steady = guest_module._Shrinking()
    for _ in range(64):
        steady.started()
    for _ in range(5000):  # one ends, one starts: the freed pages are reused at once
        assert ends(steady, 1) == 0
        steady.started()


KEPT_OUT_OF_MEMORY = (
    "let kept;\nfunction fill() { const a = []; for (;;) a.push([a.length]) }\n"
    "try { fill() } catch (e) { kept = e }\nawait tools.echo(1);\nthrow kept"
)


@pytest.mark.skipif(not memory_limit.budgets_memory(), reason="the reserve is the budget's, in C or in the hooks")
@pytest.mark.parametrize("offset", range(-32 * KIB, 32 * KIB, 8 * KIB))
def test_quickjs_can_always_raise_its_out_of_memory_error_where_memory_ran_out(offset: int, budget: str) -> None:
    """Past a refusal the hooks leave room for the error, its message and stack, wherever the
    limit falls among the arenas; without it the guest got null (21 of 32 limits around 8 MiB),
    or the error without its innermost frame (7 of 32). As the forgeries transcript (f3) has it."""
    finished = run(KEPT_OUT_OF_MEMORY, memory=8 * MIB + offset)
    assert (finished.code, finished.message) == ("runtime_error", "out of memory (line 2, column 50)")


@pytest.mark.skipif(not memory_limit.budgets_memory(), reason="the reserve is the budget's, in C or in the hooks")
def test_the_room_after_a_refusal_is_bounded(budget: str) -> None:
    code = "try { const a = []; for (;;) a.push([a.length]) } catch {}\nconst b = []; for (;;) b.push({ n: b.length })"
    guest = GuestRun(run_message(code, memory=8 * MIB, budget=30))
    finished = guest.start()
    assert isinstance(finished, ipc.Finished) and finished.code == "memory_limit"
    assert guest.memory.refusals >= 2  # the second fill was refused too, within the reserve


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * KIB


def test_a_confined_worker_gives_back_the_memory_of_executions_that_ended() -> None:
    """Without trimming, a worker keeps the pages of every runtime it ever held resident."""
    count = 600  # several trims apart (TRIM_AFTER_BYTES), whatever the arena size
    process, sock = start_worker("--max-memory", str(512 * MIB), "--threads", "4")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        before = rss_bytes(process.pid)
        for slot in range(1, count + 1):
            sock.sendall(ipc.frame(slot, run_message(PARKED, providers=SLOW, budget=60)))
        calls = {}
        for _ in range(count):
            slot, message = receive_any(sock)
            assert isinstance(message, ipc.ToolCalls)
            calls[slot] = message.calls[0][0]
        held = rss_bytes(process.pid)
        assert held - before > count * 150 * KIB
        for slot, call_id in calls.items():
            sock.sendall(ipc.frame(slot, ipc.Settle(call_id=call_id, ok=True, value=b"1")))
        for _ in range(count):
            slot, message = receive_any(sock)
            assert isinstance(message, ipc.Finished) and message.result == b"2"
        after = rss_bytes(process.pid)
        assert after - before < (held - before) / 2, ((held - before) / MIB, (after - before) / MIB)
    process.wait(timeout=30)
