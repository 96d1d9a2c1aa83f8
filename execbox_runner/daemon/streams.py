"""Writes that cost one system call: most frames fit the socket's buffer at once.

trio's ``send_all`` passes through the scheduler at least once per call (a
checkpoint), and the daemon writes several small frames per execution to hosts
and workers. Where nothing else is being written on a plain socket, the frame is
handed to the kernel directly; only what it does not take goes the trio way.
"""

from __future__ import annotations

import os

import trio


def nothing_unread(stream: trio.SocketStream) -> bool:
    """Whether the peer has sent nothing that is still unread (or has closed its side): closing
    now then cannot reset the connection. Reads nothing that would matter: it is only called once
    the closing handshake is over, after which a peer sends no more data."""
    try:
        return not os.read(stream.socket.fileno(), 1)  # b"": the peer closed; a byte: something was unread
    except BlockingIOError:
        return True
    except OSError:
        return True  # broken or closed already: nothing to linger for


def send_at_once(stream: trio.abc.Stream, data: bytes) -> int:
    """How much of ``data`` a plain socket stream took without blocking: 0 for other streams
    (TLS), a full buffer or a closed socket, which the caller's ``send_all`` then handles (and
    reports). The caller must hold its stream's write lock: nothing else may be mid-write."""
    if not isinstance(stream, trio.SocketStream):
        return 0
    try:
        return os.write(stream.socket.fileno(), data)
    except OSError:  # EAGAIN, or broken or closed: send_all says which, the trio way
        return 0
