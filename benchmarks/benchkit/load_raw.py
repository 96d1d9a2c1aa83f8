"""The ``raw`` load client (the default): ``concurrency`` executions at a time on the raw RFC 6455 client.

Each execution uses a fresh connection and waits for the server's close frame
and its TCP close, like the Sans-I/O clients; see ``rawws`` for why it is
hand-rolled.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .client import IO_TIMEOUT_S
from .rawws import OP_TEXT, RawClient, RawConn, client_frame
from .stats import LoadTally
from .workload import execute_message, tool_result


class RawLoad(RawClient):
    """``concurrency`` connections at a time, each replaced when its execution ends, until the window closes."""

    def __init__(self, host: str, port: int, concurrency: int, duration: float, code: str) -> None:
        self.tally = LoadTally(duration)
        super().__init__(host, port, hard_deadline=self.tally.deadline + IO_TIMEOUT_S)
        self.concurrency = concurrency
        self.head, self.tail = execute_message("@ID@", code).split(b"@ID@", 1)
        self.pid = os.getpid()
        self.counter = 0

    def load(self) -> dict[str, Any]:
        """The load, then the tally as a JSON-ready result."""
        for _ in range(self.concurrency):
            self.start()
        self.run()
        return self.tally.result()

    def start(self) -> None:
        """One more execution on a fresh connection, all of it bounded by ``IO_TIMEOUT_S``."""
        self.counter += 1
        self.connect(self.counter, IO_TIMEOUT_S)

    def on_open(self, conn: RawConn) -> None:
        self.send(conn, client_frame(OP_TEXT, self.head + f"r{self.pid}-{conn.key}".encode() + self.tail))

    def on_message(self, conn: RawConn, message: dict[str, Any], payload: bytes) -> None:
        """Answer tool calls at once; close after ``done``."""
        kind = message.get("type")
        if kind == "done":
            conn.outcome = "" if message.get("ok") is True else f"done not ok: {payload[:200]!r}"
            self.close(conn)
        elif kind == "tool_call":
            self.send(conn, client_frame(OP_TEXT, tool_result(message)))

    def on_end(self, conn: RawConn) -> None:
        """Count ``conn``'s execution and, while the window is open, start the next."""
        self.tally.record(conn.outcome, time.monotonic() - conn.t0)
        if self.tally.in_window():
            self.start()


def raw_load(host: str, port: int, concurrency: int, duration: float, code: str) -> dict[str, Any]:
    """Run the raw load client in this process; its result as JSON-ready figures."""
    return RawLoad(host, port, concurrency, duration, code).load()
