"""Whole writes that mostly cost one system call, to hosts and to workers alike, and
the wait for a host's next message.

trio's ``send_all`` passes through the scheduler at least once per call (a
checkpoint), and the daemon writes several small frames per execution to hosts
and workers. Where nothing else is being written on a plain socket, the frame is
handed to the kernel directly; only what it does not take goes the trio way.

trio's ``receive_some`` tries the socket first, then waits and tries again. A
parked execution waits on its host for seconds, and all that time the wait
keeps its chain of frames and objects alive. ``await_data`` reads a plain socket
the same way with a shorter chain: ~2.4 KiB less per parked session, ~15% of
the daemon's share.
"""

from __future__ import annotations

import os

import trio


async def await_data(stream: trio.abc.Stream, max_bytes: int, *, just_scheduled: bool = False) -> bytes | bytearray:
    """What ``stream.receive_some(max_bytes)`` returns (b"": the peer closed), with its errors
    and its checkpoints: cancelled before anything is read, and a schedule point after.

    ``just_scheduled``: the calling task has only begun its step (a new connection's first
    read), so bytes already there are returned without the schedule point, which would
    only cost a pass through the scheduler: letting others run is for a loop of reads.

    One reader at a time, as with trio's: a connection has one task reading.
    """
    if not isinstance(stream, trio.SocketStream):
        return await stream.receive_some(max_bytes)
    await trio.lowlevel.checkpoint_if_cancelled()
    fd = stream.socket.fileno()
    waited = False
    while True:
        try:
            data = os.read(fd, max_bytes)
        except BlockingIOError:  # nothing yet, the common case (or woken for nothing)
            await trio.lowlevel.wait_readable(fd)  # closing the socket ends the wait
            waited = True
            continue
        except OSError as exc:
            raise _stream_error(stream, exc) from exc
        if not waited and not just_scheduled:
            await trio.lowlevel.cancel_shielded_checkpoint()  # a host that floods still lets others run
        return data


def _stream_error(stream: trio.SocketStream, error: OSError) -> trio.BrokenResourceError | trio.ClosedResourceError:
    """trio's error for a failed read: the socket was closed (by us), or the connection broke."""
    if stream.socket.fileno() < 0:
        return trio.ClosedResourceError("the socket was closed")
    return trio.BrokenResourceError(f"socket connection broken: {error}")


async def close(stream: trio.abc.Stream) -> None:
    """Close ``stream`` as its task ends: a plain socket at once, without the checkpoint of
    trio's ``aclose`` (a pass through the scheduler that buys the ending task nothing)."""
    if isinstance(stream, trio.SocketStream):
        stream.socket.close()
    else:
        await stream.aclose()


def nothing_unread(stream: trio.SocketStream) -> bool:
    """Whether the peer has sent nothing that is still unread (or has closed its side): closing
    now then cannot reset the connection. Reads nothing that would matter: it is only called once
    the closing handshake is over, after which a peer sends no more data."""
    try:
        return not os.read(stream.socket.fileno(), 1)  # b"": the peer closed; a byte: something was unread
    except OSError:  # nothing unread (EAGAIN), or broken or closed already: nothing to linger for
        return True


async def write_whole(stream: trio.abc.Stream, lock: trio.Lock, data: bytes, timeout: float) -> bool:
    """Write ``data`` whole, never cut short by the caller's cancellation (half a frame would
    garble the stream), within ``timeout``; False if the peer did not take it by then. ``lock``
    is the stream's write lock: while nobody holds it, the kernel is offered ``data`` at once."""
    if not lock.locked():
        data = data[_send_at_once(stream, data) :]
        if not data:
            return True
    with trio.CancelScope(shield=True):
        async with lock:
            with trio.move_on_after(timeout) as scope:
                await stream.send_all(data)
    return not scope.cancelled_caught


def _send_at_once(stream: trio.abc.Stream, data: bytes) -> int:
    """How much of ``data`` a plain socket stream took without blocking: 0 for other streams
    (TLS), a full buffer or a closed socket, which ``send_all`` then handles (and reports)."""
    if not isinstance(stream, trio.SocketStream):
        return 0
    try:
        return os.write(stream.socket.fileno(), data)
    except OSError:  # EAGAIN, or broken or closed: send_all says which, the trio way
        return 0
