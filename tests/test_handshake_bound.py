"""The bound on connections still in their handshake sheds silent ones, never a host whose
request has arrived but not been read yet (a burst: found with 10,000 parked executions)."""

from __future__ import annotations

import logging

import pytest
import trio

from execbox_runner.daemon.endpoints import Refusals
from execbox_runner.daemon.server import Handshakes


async def test_a_connection_whose_bytes_arrived_is_not_shed_a_silent_one_is(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    clients, accepted = [], []
    for _ in range(3):
        clients.append(await trio.open_tcp_stream("127.0.0.1", port))
        accepted.append(await listener.accept())
    await clients[0].send_all(b"GET / HTTP/1.1\r\n")  # the oldest has sent its request's start
    with trio.fail_after(5):  # arrived: loopback may defer it on a loaded machine
        await trio.lowlevel.wait_readable(accepted[0].socket)
    refusals = Refusals()
    bound = Handshakes(2, refusals)
    peers = [f"127.0.0.1:{client.socket.getsockname()[1]}" for client in clients]
    for tcp, peer in zip(accepted, peers, strict=True):
        bound.add(tcp, peer)  # the third is over the bound: the oldest *silent* one goes
    assert refusals.counts["shed"] == 1
    shed_lines = [record for record in caplog.records if getattr(record, "refusal", None) == "shed"]
    assert [record.peer for record in shed_lines] == [peers[1]]  # type: ignore[attr-defined]
    assert accepted[1].socket.fileno() == -1  # shed
    assert accepted[0].socket.fileno() >= 0 and accepted[2].socket.fileno() >= 0
    assert await accepted[0].receive_some(100) == b"GET / HTTP/1.1\r\n"  # peeked, not consumed
    # The one that sent bytes left the bound: only the newest silent one is left to shed.
    assert bound.shed() and refusals.counts["shed"] == 2 and accepted[2].socket.fileno() == -1
    assert not bound.shed()
    for stream in [*clients, accepted[0], accepted[2]]:
        await stream.aclose()
    await listener.aclose()
