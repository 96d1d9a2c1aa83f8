"""The daemon's listening sockets, accepted from in bursts.

trio's ``SocketListener.accept`` passes through the scheduler after every
connection it accepts (a schedule point), and drops the peer's address, which
the daemon then asked the kernel for again. Hosts connect in bursts (a fleet
starting, a ramp of parked executions), so a ``Listener`` takes what the kernel
has queued in one step, each connection with its peer's address, and lets the
others run only every ``BURST`` connections and when the queue is empty.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Awaitable, Callable
from typing import Final, NoReturn

import trio

BACKLOG: Final = 4096
# Connections accepted in one step at most: a flood of connections still lets the sessions run.
BURST: Final = 16
# accept() errors that mean "no descriptor (or memory) for another connection now".
OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() errors that concern only the connection being accepted (reset while queued, refused by
# a firewall; Linux passes a new socket's pending network error to accept): the next one is
# accepted at once, as trio's SocketListener does.
_IGNORABLE: Final = frozenset(
    {
        errno.ECONNABORTED,
        errno.ECONNRESET,
        errno.EPERM,
        errno.EPROTO,
        errno.ENETDOWN,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.ENONET,
        errno.EHOSTUNREACH,
        errno.EOPNOTSUPP,
        errno.ENETUNREACH,
        errno.ENOSR,
        errno.ESOCKTNOSUPPORT,
        errno.EPROTONOSUPPORT,
        errno.ETIMEDOUT,
    }
)


class CannotListen(OSError):
    """An address the daemon cannot listen on (the port is taken, the address is not this
    host's); ``address`` says which of its listening addresses."""

    def __init__(self, address: str, error: OSError) -> None:
        super().__init__(error.errno, error.strerror)
        self.address = address


class Listener:
    """One listening TCP socket (non-blocking)."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._sock = sock

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._sock.getsockname()[:2]
        return host, port

    def accept_now(self) -> tuple[trio.SocketStream, str] | None:
        """A queued connection and its peer's ``host:port``; None when none is queued. Raises
        OSError when none can be accepted now (out of descriptors, say)."""
        while True:
            try:
                sock, peer = self._sock.accept()
            except BlockingIOError:
                return None
            except OSError as exc:
                if exc.errno in _IGNORABLE:
                    continue
                raise
            return trio.SocketStream(trio.socket.from_stdlib_socket(sock)), f"{peer[0]}:{peer[1]}"

    async def wait(self) -> None:
        """Until a connection is queued (or looks so: ``accept_now`` may still find none)."""
        await trio.lowlevel.wait_readable(self._sock)

    def close(self) -> None:
        trio.lowlevel.notify_closing(self._sock)
        self._sock.close()


async def listen(host: str, port: int, *, reuse_port: bool) -> list[Listener]:
    """TCP listeners on every address of ``host``; with ``reuse_port`` the port is shared with
    the other shards (the kernel spreads connections), otherwise a taken port is an error."""
    listeners = []
    for family, kind, proto, _, address in await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            sock.close()
            raise CannotListen(f"{host}:{port}", exc) from exc
        sock.listen(BACKLOG)
        listeners.append(Listener(sock))
    return listeners


async def accept_forever(
    listener: Listener,
    take: Callable[[trio.SocketStream, str], None],
    out_of_descriptors: Callable[[OSError], Awaitable[None]],
) -> NoReturn:
    """Hand every connection to ``take`` with its peer's address, at most ``BURST`` in one step.

    Out of descriptors, ``out_of_descriptors`` is awaited before the next accept (free one, or
    wait); any other error from ``accept_now`` ends the loop.
    """
    while True:
        for _ in range(BURST):
            try:
                accepted = listener.accept_now()
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    raise
                await out_of_descriptors(exc)
                continue
            if accepted is None:
                await listener.wait()
                break
            take(*accepted)
        else:
            await trio.lowlevel.checkpoint()  # a burst longer than BURST: the others run between
