"""``Transport`` over real loopback TCP (and TLS) connections, served by a running reactor:
reads reach the connection, writes the peer does not take wait in order while reading pauses,
a peer that stops reading is dropped, a close waits for what is left and lingers when asked."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import trio

from execbox_runner.daemon.net.reactor import Reactor
from execbox_runner.daemon.net.transport import Transport

from .daemonkit import certificate

WAIT_S = 10.0


class Recorder:
    def __init__(self) -> None:
        self.data = bytearray()
        self.peer_ended = False
        self.losses: list[str | None] = []
        self.stalls = 0

    def received(self, data: bytes) -> None:
        self.data += data

    def ended(self) -> None:
        self.peer_ended = True

    def lost(self, reason: str | None) -> None:
        self.losses.append(reason)

    def stalled(self) -> None:
        assert not self.losses, "told of the stall after the loss"
        self.stalls += 1


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """(the daemon's end, non-blocking; the peer's end, blocking with a timeout)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        peer = socket.create_connection(listener.getsockname(), timeout=WAIT_S)
        ours, _ = listener.accept()
    ours.setblocking(False)
    return ours, peer


@contextlib.asynccontextmanager
async def served(
    send_timeout: float = 10.0, tls: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[Transport, Recorder, socket.socket]]:
    reactor = Reactor()
    ours, peer = tcp_pair()
    recorder = Recorder()
    transport = Transport(reactor, ours, recorder, send_timeout=send_timeout, tls=tls)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reactor.run)
            yield transport, recorder, peer
            nursery.cancel_scope.cancel()
    finally:
        transport.abort()
        peer.close()
        reactor.close()


async def until(condition: object) -> None:
    with trio.fail_after(WAIT_S):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.005)


def read_all(peer: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = peer.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return bytes(data)


async def test_what_the_peer_sends_arrives_and_its_close_is_the_end() -> None:
    async with served() as (_transport, recorder, peer):
        peer.sendall(b"hello")
        await until(lambda: recorder.data == b"hello")
        peer.shutdown(socket.SHUT_WR)
        await until(lambda: recorder.peer_ended)
        assert recorder.losses == []


async def test_what_the_peer_does_not_take_waits_in_order_and_reading_pauses_meanwhile() -> None:
    payload = bytes(range(256)) * 40_000  # ~10 MB: more than the socket buffers hold
    async with served() as (transport, recorder, peer):
        transport.write(payload[:5_000_000])
        transport.write(payload[5_000_000:])
        assert transport.backlog > 0
        peer.sendall(b"while you wait")
        await trio.sleep(0.1)
        assert recorder.data == b""  # nothing is read while our answers pile up
        received = await trio.to_thread.run_sync(read_all, peer, len(payload))
        assert received == payload
        await until(lambda: recorder.data == b"while you wait")  # reading resumed
        assert transport.backlog == 0 and recorder.losses == []


async def test_a_peer_that_stops_reading_is_dropped_after_the_send_timeout() -> None:
    async with served(send_timeout=0.2) as (transport, recorder, _peer):
        transport.write(b"x" * 10_000_000)
        await until(lambda: recorder.losses)
        assert recorder.stalls == 1 and recorder.losses == [None] and not transport.open


async def test_a_close_waits_for_what_is_left_then_the_peer_sees_the_end() -> None:
    payload = b"y" * 5_000_000
    async with served() as (transport, _recorder, peer):
        transport.write(payload)
        transport.close()
        assert transport.open  # not yet: what is left goes first
        assert await trio.to_thread.run_sync(read_all, peer, len(payload) + 1) == payload  # then the end
        await until(lambda: not transport.open)


async def test_a_lingering_close_half_closes_and_reads_until_the_peer_closes() -> None:
    """Closing a socket with unread bytes resets the connection (and the reset can overtake what
    was sent last): with ``linger_s`` the transport half-closes instead and reads until the peer's end."""
    payload = b"z" * 5_000_000
    async with served() as (transport, recorder, peer):
        transport.write(payload)  # more than the buffers: reading pauses
        peer.sendall(b"unread")
        transport.close(linger_s=5.0)
        assert await trio.to_thread.run_sync(read_all, peer, len(payload) + 1) == payload  # then our end of data
        assert transport.open and recorder.data == b""  # still reading (and discarding) what the peer sends
        peer.sendall(b"more")
        peer.shutdown(socket.SHUT_WR)
        await until(lambda: not transport.open)


async def test_tls_is_handshaken_then_carries_both_ways_and_closes_with_close_notify() -> None:
    with tempfile.TemporaryDirectory() as directory:
        certfile, keyfile, trusted = certificate(Path(directory))
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(certfile, keyfile)
        async with served(tls=server) as (transport, recorder, peer):

            def client() -> bytes:
                with trusted.wrap_socket(peer, server_hostname="127.0.0.1", do_handshake_on_connect=True) as tls:
                    tls.sendall(b"hello over tls")
                    answer = tls.recv(100)
                    assert tls.recv(100) == b""  # the server's close_notify: a clean end
                    tls.detach()
                    return answer

            async with trio.open_nursery() as nursery:
                answers: list[bytes] = []

                async def run_client() -> None:
                    answers.append(await trio.to_thread.run_sync(client))

                nursery.start_soon(run_client)
                await until(lambda: recorder.data == b"hello over tls")
                transport.write(b"hello back")
                transport.close()
            assert answers == [b"hello back"] and recorder.losses == []


async def test_what_one_pass_writes_to_a_peer_goes_at_its_end_in_one_write() -> None:
    """Frames for one host within a pass (a guest's several tool calls) cost one system call."""
    async with served() as (transport, _recorder, peer):
        unsent: list[bool] = []

        def write_three() -> None:
            for part in (b"one ", b"two ", b"three"):
                transport.write(part)
            if not select.select([peer], [], [], 0)[0]:
                unsent.append(True)  # nothing written yet, within the pass

        transport._reactor.call_at(trio.current_time(), write_three)
        with trio.fail_after(WAIT_S):
            await trio.lowlevel.wait_readable(peer)
        assert unsent == [True] and peer.recv(100) == b"one two three"


async def test_what_arrived_before_the_transport_was_made_is_read_at_once_when_asked() -> None:
    """A host's request usually arrives with its connection: ``read_now`` takes it without waiting
    for the reactor's next pass (which this test never runs)."""
    reactor = Reactor()
    ours, peer = tcp_pair()
    with peer:
        peer.sendall(b"GET / HTTP/1.1\r\n\r\n")
        select.select([ours], [], [], WAIT_S)
        recorder = Recorder()
        transport = Transport(reactor, ours, recorder, send_timeout=1.0)
        transport.read_now()
        assert recorder.data == b"GET / HTTP/1.1\r\n\r\n"
        transport.abort()
    reactor.close()
