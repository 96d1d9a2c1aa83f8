"""The ``sansio`` load client: websockets' ``ClientProtocol`` over ``asyncio.Protocol`` callbacks.

Costs about 2.5x the ``raw`` client's CPU per execution, but uses websockets'
own client code, as a cross-check of the raw one.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import WebSocketURI

from .client import IO_TIMEOUT_S
from .stats import LoadTally
from .workload import execute_message, tool_result

RETRY_PAUSE_S = 0.01  # after a failure, so a refusing server is not hammered


class _AsyncExecution(asyncio.Protocol):
    """One execution over one fresh connection, driven by asyncio callbacks."""

    def __init__(self, uri: WebSocketURI, execute: bytes, finished: asyncio.Future[str]) -> None:
        self.ws = ClientProtocol(uri, max_size=None)
        self.execute = execute
        self.finished = finished
        self.transport: asyncio.Transport | None = None
        self.outcome = "connection ended without done"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.ws.send_request(self.ws.connect())
        self._flush()

    def data_received(self, data: bytes) -> None:
        self.ws.receive_data(data)
        self._events()

    def eof_received(self) -> bool:
        self.ws.receive_eof()
        self._events()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.finished.set_result(self.outcome)

    def _events(self) -> None:
        for event in self.ws.events_received():
            if isinstance(event, Response):
                if self.ws.state is State.OPEN:
                    self.ws.send_text(self.execute)
                else:
                    self.outcome = f"handshake failed: HTTP {event.status_code}"
            elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                message = json.loads(bytes(event.data))
                kind = message.get("type")
                if kind == "done":
                    self.outcome = "" if message.get("ok") is True else f"done not ok: {event.data[:200]!r}"
                    self.ws.send_close(1000)
                elif kind == "tool_call":
                    self.ws.send_text(tool_result(message))
        self._flush()

    def _flush(self) -> None:
        assert self.transport is not None
        for data in self.ws.data_to_send():
            if data:
                self.transport.write(data)
            else:
                self.transport.close()


async def _execute(uri: WebSocketURI, payload: bytes) -> str:
    """One execution on a fresh connection; its outcome ("" for success)."""
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[str] = loop.create_future()
    try:
        async with asyncio.timeout(IO_TIMEOUT_S):
            await loop.create_connection(functools.partial(_AsyncExecution, uri, payload, finished), uri.host, uri.port)
            return await finished
    except (OSError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"


async def sansio_load(uri: WebSocketURI, concurrency: int, duration: float, code: str) -> dict[str, Any]:
    """Run ``concurrency`` sequential execution loops for ``duration`` seconds."""
    tally = LoadTally(duration)
    execute_prefix = execute_message("ID", code)
    counter = 0

    async def one() -> None:
        nonlocal counter
        while tally.in_window():
            counter += 1
            payload = execute_prefix.replace(b'"id":"ID"', f'"id":"t{os.getpid()}-{counter}"'.encode(), 1)
            t0 = time.perf_counter()
            outcome = await _execute(uri, payload)
            tally.record(outcome, time.perf_counter() - t0)
            if outcome:
                await asyncio.sleep(RETRY_PAUSE_S)

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return tally.result()
