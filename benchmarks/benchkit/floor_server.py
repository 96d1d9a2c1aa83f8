"""The network side's floor: the daemon's own socket path answering every ``execute`` with nothing behind it.

Per connection it does what the daemon does for a trivial execution, with the
daemon's own pieces (``reactor``: one task serving every socket; ``listeners``:
connections accepted in bursts; ``transport``: reads and writes; ``handshake``:
the upgrade fast path; ``frames``: plain frames, websockets' ``Protocol`` for the rest) and
nothing else: no session state machine, no worker, no timers, no logs, no
metrics. It answers the upgrade, then each ``execute`` with ``started`` and a
``done`` (result 2) in two writes, as the daemon does, then the closing
handshake. The CPU it spends per session is what the daemon cannot go below on
this stack (``throughput.py --floor`` prints both). Run as ``python -m benchkit.floor_server``:
it prints its URL and serves until its stdin closes.
"""

from __future__ import annotations

import functools
import logging
import socket
import sys
from typing import Final

import msgspec
import trio
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from execbox_runner.daemon.net import handshake
from execbox_runner.daemon.net.frames import PlainFrames
from execbox_runner.daemon.net.listeners import Acceptor, listen
from execbox_runner.daemon.net.reactor import Reactor
from execbox_runner.daemon.net.transport import Transport

LISTENING: Final = "floor listening on"
LOG: Final = logging.getLogger("websockets.server")
SEND_TIMEOUT_S: Final = 10.0


class _Execute(msgspec.Struct):
    id: str


_execute: Final = msgspec.json.Decoder(_Execute)


class Session:
    """One connection: upgrade, answer each ``execute``, close; anything unexpected just ends it."""

    def __init__(self, reactor: Reactor, sock: socket.socket) -> None:
        self.ws: PlainFrames | None = None
        self.transport = Transport(reactor, sock, self, send_timeout=SEND_TIMEOUT_S)

    def received(self, data: bytes) -> None:
        if self.ws is None:
            upgrade = handshake.parse_upgrade(data)
            if upgrade is None:
                self.transport.abort()
                return
            self.ws = PlainFrames(max_size=1 << 20, logger=LOG)
            self.ws.receive_data(upgrade.rest)
            self.transport.write(handshake.response(upgrade.accept, "floor"))
        else:
            self.ws.receive_data(data)
        ws = self.ws
        for event in ws.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                try:
                    execution = _execute.decode(event.data).id.encode()
                except msgspec.DecodeError:
                    self.transport.abort()
                    return
                for answer in (
                    b'{"type":"started","id":"%s"}' % execution,
                    b'{"type":"done","id":"%s","ok":true,"result":2,"logs":[],"durationMs":0}' % execution,
                ):
                    ws.send_text(answer)
                    self.transport.write(b"".join(ws.data_to_send()))
        chunks = ws.data_to_send()  # the close reply, then the end-of-data marker
        if chunks:
            self.transport.write(b"".join(chunks))
        if (chunks and not chunks[-1]) or ws.state is State.CLOSED:
            self.transport.close()

    def ended(self) -> None:
        self.transport.close()

    def lost(self, reason: str | None) -> None:
        pass

    def stalled(self) -> None:
        pass


def _session(reactor: Reactor, sock: socket.socket, _peer: str) -> None:
    Session(reactor, sock)  # the reactor holds it from here


def main() -> None:
    """Serve on a free loopback port until stdin closes (the parent is done or dead)."""

    async def run() -> None:
        reactor = Reactor()
        listeners = await listen("127.0.0.1", 0, reuse_port=False)
        host, port = listeners[0].address
        for listener in listeners:
            # The daemon's own acceptor: a burst of connections in one step, each a session of the reactor.
            Acceptor(reactor, listener, functools.partial(_session, reactor), lambda _error: False)
        print(f"{LISTENING} ws://{host}:{port}/", flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reactor.run)
            await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
            nursery.cancel_scope.cancel()

    trio.run(run)


if __name__ == "__main__":
    main()
