"""A worker reports its guests' heaps when asked, and ends the one the daemon evicts with
``memory_limit``, parked or running (the daemon's memory budget, see test_memory_budget.py)."""

from __future__ import annotations

from execbox_runner.protocol import ipc
from execbox_runner.worker.failure import BUDGET_MESSAGE

from .guestkit import run_message
from .test_sandbox import receive, receive_any, start_worker

BIG = "const big = new Uint8Array(32 << 20).fill(1); console.log('holding'); await tools.echo(1); big.length"


def test_a_worker_reports_each_guests_heap_and_ends_an_evicted_one_with_memory_limit() -> None:
    process, sock = start_worker("--max-memory", str(256 << 20), "--threads", "2")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        tools = [("tools", ["echo"])]
        sock.sendall(ipc.frame(1, run_message(BIG, providers=tools, budget=30, memory=128 << 20)))
        sock.sendall(ipc.frame(2, run_message("await tools.echo(2)", providers=tools, budget=30)))
        parked = [receive_any(sock) for _ in range(2)]  # both parked, in either order
        assert sorted(slot for slot, message in parked if isinstance(message, ipc.ToolCalls)) == [1, 2]
        sock.sendall(ipc.frame(0, ipc.Measure()))
        heaps = receive(sock, 0)
        assert isinstance(heaps, ipc.Heaps)
        sizes = dict(heaps.sizes)
        assert sizes.keys() == {1, 2} and sizes[1] > 32 << 20 > sizes[2] > 0
        sock.sendall(ipc.frame(1, ipc.Evict()))
        evicted = receive(sock, 1)
        assert isinstance(evicted, ipc.Finished) and (evicted.code, evicted.message) == ("memory_limit", BUDGET_MESSAGE)
        sock.sendall(ipc.frame(0, ipc.Measure()))
        after = receive(sock, 0)
        assert isinstance(after, ipc.Heaps) and dict(after.sizes).keys() == {2}
    process.wait(timeout=30)
