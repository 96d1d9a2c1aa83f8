"""The ``raw`` parked client (the default): N parked executions on the raw RFC 6455 client.

The websockets asyncio client spends ~1.3-1.6 ms of CPU per session, nearly
half of this 2-core machine while thousands of sessions open, so its figures
measured the client as much as the daemon; this one spends ~0.35 ms.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

from .parking import RUN_S, WAIT_S, ParkedTally, answer, execute
from .rawws import CLOSING, CONNECTING, HANDSHAKE, OP_TEXT, POLL_S, RawClient, RawConn, client_frame


class RawParked(RawClient):
    """``n`` executions, at most ``opening`` handshakes at a time, each tool call answered ``delay`` s after it came."""

    def __init__(self, host: str, port: int, n: int, delay: float, opening: int) -> None:
        """Built when the run begins: the tally's clock and the hard deadline start here."""
        super().__init__(host, port, hard_deadline=time.monotonic() + delay + RUN_S)
        self.n, self.delay, self.opening = n, delay, max(1, opening)
        self.tally = ParkedTally(n)
        self.next_index = 0
        self.handshaking = 0
        self.answers: list[tuple[float, int, RawConn, bytes]] = []  # (due, index, conn, tool_result), a heap

    def park(self) -> dict[str, Any]:
        """The run, then the tally as a JSON-ready result."""
        self.launch()
        self.run()
        return self.tally.result()

    def launch(self) -> None:
        """Open connections until ``opening`` handshakes are under way or all ``n`` are started.

        Hosts are separate machines that send their request as soon as they
        connect; one client opening thousands at once would leave most of them
        connected and silent for seconds, which the daemon sheds as an idle flood.
        """
        if time.monotonic() >= self.hard_deadline:
            self.next_index = self.n  # the rest never start and count as unended
        while self.handshaking < self.opening and self.next_index < self.n:
            index = self.next_index
            self.next_index += 1
            try:
                self.connect(index, WAIT_S)
            except OSError as exc:  # out of descriptors or ports: a failure, not the end of the run
                self.tally.end(f"connect: {type(exc).__name__}: {exc}", 0)
                continue
            self.handshaking += 1

    def busy(self) -> bool:
        return bool(self.conns) or self.next_index < self.n

    def on_open(self, conn: RawConn) -> None:
        """Send the ``execute`` right after the 101; let the next handshake start."""
        self.handshaking -= 1
        self.launch()
        conn.deadline = time.monotonic() + WAIT_S
        self.send(conn, client_frame(OP_TEXT, execute(conn.key, self.delay)))

    def on_message(self, conn: RawConn, message: dict[str, Any], payload: bytes) -> None:
        """Schedule the answer to a ``tool_call``; check a ``done`` and close."""
        kind = message.get("type")
        now = time.monotonic()
        if kind == "tool_call":
            self.tally.parked()
            due = now + self.delay
            heapq.heappush(self.answers, (due, conn.key, conn, client_frame(OP_TEXT, answer(message, conn.key))))
            conn.deadline = due + WAIT_S
        elif kind == "done":
            conn.outcome = self.tally.done(message, conn.key)
            self.close(conn)
            conn.deadline = now + WAIT_S

    def tick(self, now: float) -> float:
        """Send the tool results that are due; wait at most until the next one is."""
        answers = self.answers
        while answers and answers[0][0] <= now:
            _, _, conn, frame = heapq.heappop(answers)
            fd = conn.sock.fileno()
            if self.conns.get(fd) is not conn or conn.state >= CLOSING:
                continue  # ended (or closed by the server) while parked
            try:
                self.send(conn, frame)
            except OSError as exc:
                self.fail(fd, conn, f"{type(exc).__name__}: {exc}")
                continue
            conn.deadline = now + WAIT_S
        return min(POLL_S, answers[0][0] - now) if answers else POLL_S

    def on_end(self, conn: RawConn) -> None:
        """Count the session; a connection that ended during its handshake frees a slot for the next."""
        self.tally.end(conn.outcome, conn.status)
        if conn.state in (CONNECTING, HANDSHAKE):
            self.handshaking -= 1
            self.launch()


def raw_parked(host: str, port: int, n: int, delay: float, opening: int) -> dict[str, Any]:
    """Run the raw parked client in this process; its result as JSON-ready figures."""
    return RawParked(host, port, n, delay, opening).park()
