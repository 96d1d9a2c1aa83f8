"""The daemon's listening sockets, accepted from in bursts by the reactor.

Hosts connect in bursts (a fleet starting, a ramp of parked executions), so an
``Acceptor`` takes what the kernel has queued, up to ``BURST`` connections
each time the listening socket is ready, each with its peer's address from
``accept``; the reactor serves the other sockets in between.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable
from typing import Final

import trio

from .reactor import READ, Reactor

log = logging.getLogger(__name__)

BACKLOG: Final = 4096
# Connections accepted in one step at most: a flood of connections still lets the sessions run.
BURST: Final = 16
RETRY_S: Final = 0.1  # out of descriptors, none freed: the pause before accepting again
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

    def fileno(self) -> int:
        return self._sock.fileno()

    def accept_now(self) -> tuple[socket.socket, str] | None:
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
            sock.setblocking(False)
            return sock, f"{peer[0]}:{peer[1]}"

    def close(self) -> None:
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


class Acceptor:
    """Accept a listener's connections as the reactor finds them queued, and hand each to ``take``
    with its peer's address.

    Out of descriptors, ``out_of_descriptors(error)`` is asked to free one: True, and the next
    accept is tried at once; False, and accepting pauses ``RETRY_S``. Any other error is logged,
    and accepting pauses ``RETRY_S`` too: a listener never stops for good.
    """

    def __init__(
        self,
        reactor: Reactor,
        listener: Listener,
        take: Callable[[socket.socket, str], None],
        out_of_descriptors: Callable[[OSError], bool],
    ) -> None:
        self._reactor = reactor
        self._listener = listener
        self._take = take
        self._out_of_descriptors = out_of_descriptors
        reactor.register(listener.fileno(), READ, self._ready)

    def _ready(self, _mask: int) -> None:
        for _ in range(BURST):
            try:
                accepted = self._listener.accept_now()
            except OSError as exc:
                if exc.errno in OUT_OF_DESCRIPTORS and self._out_of_descriptors(exc):
                    continue
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    log.error("cannot accept a connection: %s", exc)
                self._reactor.unregister(self._listener.fileno())
                self._reactor.call_at(self._reactor.now() + RETRY_S, self._resume)
                return
            if accepted is None:
                return
            self._take(*accepted)

    def _resume(self) -> None:
        self._reactor.register(self._listener.fileno(), READ, self._ready)

    def close(self) -> None:
        self._reactor.unregister(self._listener.fileno())
        self._listener.close()
