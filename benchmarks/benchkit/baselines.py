"""The baseline: a bare WebSocket echo server, built like the daemon, and the two round trips measured on it.

The server is websockets' Sans-I/O ``ServerProtocol`` over trio (the daemon's
own stack) in its own process, so "daemon / bare" isolates what the runner
adds. Run as ``python -m benchkit.baselines``: it prints its URL and serves
until its stdin closes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Final

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.uri import WebSocketURI

from .client import RECEIVE_BYTES, BlockingClient
from .processes import Server, popen_module, start_server
from .stats import LatencyStats

LISTENING: Final = "echo listening on"


def start_echo_server() -> Server:
    """The echo server in its own process; it stops when ``Server.stop`` closes its stdin."""
    return start_server(popen_module("baselines", stdin=subprocess.PIPE), LISTENING)


def bare_connect_echo_close_once(uri: WebSocketURI, stats: LatencyStats, payload: bytes) -> None:
    """Baseline (a): connect, one echo of ``payload``, closing handshake, TCP close."""
    try:
        t0 = time.perf_counter()
        client = BlockingClient(uri)
        client.send_text(payload)
        echoed = next(client.texts(), None)
        client.close()
        elapsed = time.perf_counter() - t0
    except (OSError, ValueError) as exc:
        stats.fail(f"{type(exc).__name__}: {exc}")
        return
    _record(stats, payload, echoed, elapsed)


def bare_echo_once(client: BlockingClient, texts: Iterator[bytes], stats: LatencyStats, payload: bytes) -> None:
    """Baseline (b): one echo round trip of ``payload`` on an open connection."""
    t0 = time.perf_counter()
    client.send_text(payload)
    echoed = next(texts, None)
    _record(stats, payload, echoed, time.perf_counter() - t0)


def _record(stats: LatencyStats, payload: bytes, echoed: bytes | None, elapsed_s: float) -> None:
    """A sample if the echo came back intact, else a failure."""
    if echoed != payload:
        stats.fail("echo mismatch")
    else:
        stats.samples_ms.append(elapsed_s * 1000)


def echo_server_main() -> None:
    """Serve echoes on a free loopback port until stdin closes (the parent is done or dead)."""
    import trio
    from websockets.server import ServerProtocol

    async def handle(stream: trio.SocketStream) -> None:
        ws = ServerProtocol(max_size=16 * 1024 * 1024)
        eof = False

        async def flush() -> None:
            nonlocal eof
            for data in ws.data_to_send():
                if data:
                    await stream.send_all(data)
                else:
                    eof = True

        try:
            while not eof:
                data = await stream.receive_some(RECEIVE_BYTES)
                if data:
                    ws.receive_data(data)
                else:
                    ws.receive_eof()
                for event in ws.events_received():
                    if isinstance(event, Request):
                        ws.send_response(ws.accept(event))
                    elif isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                        ws.send_text(event.data)
                await flush()
                if not data or ws.state is State.CLOSED:
                    break
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()

    async def main() -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        for listener in listeners:
            listener.socket.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        port = listeners[0].socket.getsockname()[1]
        print(f"{LISTENING} ws://127.0.0.1:{port}/", flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, handle, listeners)
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(main)


if __name__ == "__main__":
    echo_server_main()
