"""The network side's floor: the daemon's own socket path answering every ``execute`` with nothing behind it.

Per connection it does what the daemon does for a trivial execution, with the
daemon's own pieces (``listeners``: connections accepted in bursts;
``handshake``: the upgrade fast path; ``streams``: reads and whole writes;
websockets' Sans-I/O ``Protocol`` for frames) and nothing else: no session
state machine, no worker, no relay task, no timers, no logs, no metrics. It
answers the upgrade, then each ``execute`` with ``started`` and a ``done``
(result 2) in two writes, as the daemon does, then the closing handshake. The
CPU it spends per session is what the daemon cannot go below on this stack
(``floor.py`` prints both). Run as ``python -m benchkit.floor_server``: it
prints its URL and serves until its stdin closes.
"""

from __future__ import annotations

import sys
from typing import Final

import msgspec
import trio
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side, State

from execbox_runner.daemon import handshake
from execbox_runner.daemon.listeners import accept_forever, listen
from execbox_runner.daemon.streams import await_data, close, write_whole

LISTENING: Final = "floor listening on"
RECEIVE_BYTES: Final = 64 << 10
SEND_TIMEOUT_S: Final = 10.0
RETRY_S: Final = 0.1  # out of descriptors: the wait before the next accept


class _Execute(msgspec.Struct):
    id: str


_execute: Final = msgspec.json.Decoder(_Execute)


async def serve_connection(stream: trio.SocketStream) -> None:
    """One session: upgrade, answer each ``execute``, close; any failure just ends it."""
    lock = trio.Lock()
    try:
        data = await await_data(stream, RECEIVE_BYTES, just_scheduled=True)
        upgrade = handshake.parse_upgrade(data) if data else None
        if upgrade is None:
            return
        ws = Protocol(Side.SERVER)
        ws.receive_data(upgrade.rest)
        if not await write_whole(stream, lock, handshake.response(upgrade.accept, "floor"), SEND_TIMEOUT_S):
            return
        while True:
            for event in ws.events_received():
                if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                    execution = _execute.decode(event.data).id.encode()
                    for answer in (
                        b'{"type":"started","id":"%s"}' % execution,
                        b'{"type":"done","id":"%s","ok":true,"result":2,"logs":[],"durationMs":0}' % execution,
                    ):
                        ws.send_text(answer)
                        await write_whole(stream, lock, b"".join(ws.data_to_send()), SEND_TIMEOUT_S)
            chunks = ws.data_to_send()  # the close reply, then the end-of-data marker
            if chunks:
                await write_whole(stream, lock, b"".join(chunks), SEND_TIMEOUT_S)
            if (chunks and not chunks[-1]) or ws.state is State.CLOSED:
                return
            data = await await_data(stream, RECEIVE_BYTES)
            if not data:
                return
            ws.receive_data(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, msgspec.DecodeError):
        pass
    finally:
        await close(stream)


async def wait_for_descriptors(_error: OSError) -> None:
    """Out of descriptors: a session ends soon (the benchmark's load is bounded)."""
    await trio.sleep(RETRY_S)


def main() -> None:
    """Serve on a free loopback port until stdin closes (the parent is done or dead)."""

    async def run() -> None:
        listeners = await listen("127.0.0.1", 0, reuse_port=False)
        host, port = listeners[0].address
        print(f"{LISTENING} ws://{host}:{port}/", flush=True)
        async with trio.open_nursery() as nursery:
            for listener in listeners:
                # The daemon's own loop: a burst of connections in one step, each its own task.
                nursery.start_soon(
                    accept_forever,
                    listener,
                    lambda tcp, _peer: nursery.start_soon(serve_connection, tcp),
                    wait_for_descriptors,
                )
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(run)


if __name__ == "__main__":
    main()
