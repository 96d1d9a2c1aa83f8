"""Runners take turns (``loop.Worker._runner``): the one holding the turn runs short steps while
another stands by, and a long step lets the others go on without it."""

from __future__ import annotations

import time

from execbox_runner.protocol import ipc
from execbox_runner.worker.loop import recv_exactly

from .guestkit import run_message
from .test_sandbox import receive, start_worker


def test_a_guest_spinning_with_the_turn_holds_up_no_neighbour() -> None:
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "2")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(ipc.frame(1, run_message("while (true) {}", budget=3)))
        time.sleep(0.1)  # its runner took the turn and spins
        sent = time.monotonic()
        sock.sendall(ipc.frame(2, run_message("6 * 7")))
        quick = receive(sock, 2)
        assert isinstance(quick, ipc.Finished) and quick.result == b"42"
        assert time.monotonic() - sent < 0.5
        spinner = receive(sock, 1)
        assert isinstance(spinner, ipc.Finished) and spinner.code == "timeout"
    process.wait(timeout=30)


def test_runs_sent_at_once_all_finish_beside_a_spinning_guest() -> None:
    count = 300
    process, sock = start_worker("--max-memory", str(256 << 20))
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        frames = [ipc.frame(1, run_message("while (true) {}", budget=2))]
        frames += [ipc.frame(slot, run_message(f"{slot} * 2", budget=30)) for slot in range(2, count + 2)]
        sock.sendall(b"".join(frames))
        results: dict[int, bytes | None] = {}
        for _ in range(count):
            (length,) = ipc.HEADER.unpack(recv_exactly(sock, ipc.HEADER.size))
            slot, message = ipc.from_worker_decoder.decode(recv_exactly(sock, length))
            assert isinstance(message, ipc.Finished) and message.ok, message
            results[slot] = message.result
        assert results == {slot: str(slot * 2).encode() for slot in range(2, count + 2)}
        assert receive(sock, 1).code == "timeout"  # type: ignore[union-attr]
    process.wait(timeout=30)
