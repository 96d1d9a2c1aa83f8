"""The bound on connections still in their handshake sheds silent ones, never a host whose
request has arrived but not been read yet (a burst: found with 10,000 parked executions)."""

from __future__ import annotations

import logging
import socket

import pytest

from execbox_runner.daemon.net.reactor import Reactor
from execbox_runner.daemon.net.transport import Transport
from execbox_runner.daemon.observability.endpoints import Refusals
from execbox_runner.daemon.server import Handshakes


class Accepted:
    """An accepted connection in its handshake, as the bound sees one: its peer, and its transport
    (a real socket, which the reactor never serves here) to peek at and to close."""

    def __init__(self, reactor: Reactor, sock: socket.socket, peer: str) -> None:
        self.peer = peer
        self.transport = Transport(reactor, sock, self, send_timeout=1.0)

    def has_sent(self) -> bool:
        return self.transport.has_sent()

    def abort(self) -> None:
        self.transport.abort()

    def received(self, data: bytes) -> None:
        raise AssertionError("not served")

    def ended(self) -> None:
        raise AssertionError("not served")

    def lost(self, reason: str | None) -> None:
        raise AssertionError("not served")

    def stalled(self) -> None:
        raise AssertionError("not served")


def test_a_connection_whose_bytes_arrived_is_not_shed_a_silent_one_is(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    reactor = Reactor()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        clients = [socket.create_connection(listener.getsockname(), timeout=5) for _ in range(3)]
        accepted = []
        for _ in clients:
            sock, address = listener.accept()
            sock.setblocking(False)
            accepted.append(Accepted(reactor, sock, "{}:{}".format(*address)))
        clients[0].sendall(b"GET / HTTP/1.1\r\n")  # the oldest has sent its request's start
        with socket.socket(fileno=accepted[0].transport.fd) as peek:  # until it has arrived: loopback may defer it
            try:
                peek.settimeout(5)
                assert peek.recv(1, socket.MSG_PEEK) == b"G"
            finally:
                peek.setblocking(False)
                peek.detach()
        refusals = Refusals()
        bound = Handshakes(2, refusals)
        for connection in accepted:
            bound.add(connection)  # the third is over the bound: the oldest *silent* one goes
        assert refusals.counts["shed"] == 1
        shed_lines = [record for record in caplog.records if getattr(record, "refusal", None) == "shed"]
        assert [record.peer for record in shed_lines] == [accepted[1].peer]  # type: ignore[attr-defined]
        assert not accepted[1].transport.open  # shed
        assert accepted[0].transport.open and accepted[2].transport.open
        assert accepted[0].has_sent()  # peeked, not consumed
        # The one that sent bytes left the bound: only the newest silent one is left to shed.
        assert bound.shed() and refusals.counts["shed"] == 2 and not accepted[2].transport.open
        assert not bound.shed()
        accepted[0].abort()
        for sock in clients:
            sock.close()
    reactor.close()
