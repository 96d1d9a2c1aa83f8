"""``streams.await_data``: the wait for a host's next bytes on a plain socket, which must end as
trio's ``receive_some`` does in every case a connection meets (data, the peer's close, a
reset, our own close, cancellation), over real TCP sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
import trio.testing

from execbox_runner.daemon.streams import await_data, close


async def tcp_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """A connected (server side, client side) pair of TCP streams on 127.0.0.1."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await listeners[0].aclose()
    return server, client


async def arrived(stream: trio.SocketStream) -> None:
    """Until the peer's bytes can be read: loopback may defer them on a loaded machine, so a
    fixed sleep does not promise they are there."""
    with trio.fail_after(5):
        await trio.lowlevel.wait_readable(stream.socket)


async def test_it_returns_what_arrives_while_it_waits() -> None:
    server, client = await tcp_pair()
    async with server, client, trio.open_nursery() as nursery:

        async def later() -> None:
            await trio.sleep(0.05)
            await client.send_all(b"execute")

        nursery.start_soon(later)
        with trio.fail_after(5):
            assert await await_data(server, 65536) == b"execute"


async def test_it_returns_what_was_there_before_it_waited() -> None:
    server, client = await tcp_pair()
    async with server, client:
        await client.send_all(b"early")
        with trio.fail_after(5):
            assert await await_data(server, 3) == b"ear"  # at most max_bytes, as receive_some
            assert await await_data(server, 65536) == b"ly"


async def test_the_peers_close_is_end_of_data() -> None:
    server, client = await tcp_pair()
    async with server:
        await client.aclose()
        with trio.fail_after(5):
            assert await await_data(server, 65536) == b""


async def test_a_reset_is_a_broken_resource() -> None:
    server, client = await tcp_pair()
    async with server:
        # SO_LINGER with a zero timeout: closing sends a reset instead of a FIN.
        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await client.aclose()
        with trio.fail_after(5), pytest.raises(trio.BrokenResourceError):
            await await_data(server, 65536)


async def test_our_close_while_it_waits_ends_the_wait() -> None:
    """As a handshake shed by a flood is closed by another task (server.Handshakes)."""
    server, client = await tcp_pair()
    async with client, trio.open_nursery() as nursery:

        async def close_soon() -> None:
            await trio.sleep(0.05)
            server.socket.close()

        nursery.start_soon(close_soon)
        with trio.fail_after(5), pytest.raises(trio.ClosedResourceError):
            await await_data(server, 65536)
        with pytest.raises(trio.ClosedResourceError):
            await await_data(server, 65536)  # and any later read


async def test_a_deadline_cancels_the_wait_and_leaves_the_bytes_for_the_next() -> None:
    server, client = await tcp_pair()
    async with server, client:
        with trio.move_on_after(0.05) as scope:
            await await_data(server, 65536)
        assert scope.cancelled_caught
        await client.send_all(b"after")
        with trio.fail_after(5):
            assert await await_data(server, 65536) == b"after"


async def test_other_streams_are_read_their_own_way() -> None:
    """A TLS stream (or any other) is read with its own receive_some."""
    left, right = trio.testing.memory_stream_pair()
    await left.send_all(b"in memory")
    with trio.fail_after(5):
        assert await await_data(right, 65536) == b"in memory"


async def test_a_cancelled_read_takes_nothing_even_when_bytes_wait() -> None:
    """Cancelled first, as trio's: a session's timer that fires leaves the host's bytes unread."""
    server, client = await tcp_pair()
    async with server, client:
        await client.send_all(b"pending")
        await arrived(server)
        with trio.CancelScope() as scope:
            scope.cancel()
            await await_data(server, 65536)
        assert scope.cancelled_caught
        with trio.fail_after(5):
            assert await await_data(server, 65536) == b"pending"


async def test_a_read_of_waiting_bytes_is_still_a_checkpoint() -> None:
    """A host that keeps the socket full must not starve the daemon's other tasks."""
    server, client = await tcp_pair()
    async with server, client:
        await client.send_all(b"x" * 100)
        await arrived(server)  # the read takes it at once
        with trio.testing.assert_checkpoints():
            assert await await_data(server, 10) == b"x" * 10


class _Yields(trio.abc.Instrument):
    """Counts the times a task gives the scheduler back its turn: its schedule points."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.count = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.count += 1


async def test_a_first_read_of_waiting_bytes_is_no_schedule_point() -> None:
    """A new connection's first read (``just_scheduled``): the handshake request is there, and the
    task goes on to answer it in the same step, without a pass through the scheduler."""
    server, client = await tcp_pair()
    async with server, client:
        await client.send_all(b"GET / HTTP/1.1")
        await arrived(server)
        yields = _Yields(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(yields)
        try:
            assert await await_data(server, 65536, just_scheduled=True) == b"GET / HTTP/1.1"
        finally:
            trio.lowlevel.remove_instrument(yields)
        assert yields.count == 0


async def test_a_first_read_is_still_a_cancel_point_and_still_waits() -> None:
    server, client = await tcp_pair()
    async with server, client, trio.open_nursery() as nursery:
        await client.send_all(b"pending")
        await arrived(server)
        with trio.CancelScope() as scope:
            scope.cancel()
            await await_data(server, 65536, just_scheduled=True)
        assert scope.cancelled_caught
        with trio.fail_after(5):
            assert await await_data(server, 65536, just_scheduled=True) == b"pending"

        async def later() -> None:
            await trio.sleep(0.05)
            await client.send_all(b" more")

        nursery.start_soon(later)
        with trio.fail_after(5):
            assert await await_data(server, 65536, just_scheduled=True) == b" more"  # waited for


async def test_close_ends_a_plain_socket_at_once_and_the_peer_sees_its_end() -> None:
    server, client = await tcp_pair()
    async with client:
        await close(server)
        assert server.socket.fileno() == -1  # closed within the call, not at a later step
        with trio.fail_after(5):
            assert await client.receive_some(100) == b""


async def test_close_closes_other_streams_their_own_way() -> None:
    left, right = trio.testing.memory_stream_pair()
    await close(right)
    with pytest.raises(trio.BrokenResourceError):
        await left.send_all(b"gone")
