"""``listeners``: a burst of connections accepted in one step, each with its peer's address, over
real sockets on 127.0.0.1; and the daemon serving a burst, each execution logged with its peer."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator

import trio

from execbox_runner.daemon.listeners import BURST, Listener, accept_forever, listen

from .daemonkit import client, run_to_done, running_daemon

WAIT_S = 10.0


@contextlib.asynccontextmanager
async def connected(count: int) -> AsyncIterator[tuple[Listener, list[socket.socket]]]:
    """A listener on 127.0.0.1 with ``count`` clients connected to it (queued, not yet accepted)."""
    [listener] = await listen("127.0.0.1", 0, reuse_port=False)
    clients: list[socket.socket] = []
    try:
        clients += [socket.create_connection(listener.address) for _ in range(count)]
        yield listener, clients
    finally:
        for sock in clients:
            sock.close()
        listener.close()


def peers_of(clients: list[socket.socket]) -> set[str]:
    """The ``host:port`` each client connected from, as the listener reports its peer."""
    return {f"127.0.0.1:{sock.getsockname()[1]}" for sock in clients}


async def test_a_burst_is_accepted_at_once_each_with_its_peer() -> None:
    async with connected(20) as (listener, clients):
        accepted: list[tuple[trio.SocketStream, str]] = []
        with trio.fail_after(WAIT_S):
            while len(accepted) < len(clients):
                got = listener.accept_now()
                if got is None:
                    await listener.wait()
                else:
                    accepted.append(got)
        assert listener.accept_now() is None  # the queue is empty
        assert {peer for _, peer in accepted} == peers_of(clients)
        # Each one is a working stream to its own client.
        for tcp, peer in accepted:
            await tcp.send_all(peer.encode())
        for sock in clients:
            sock.settimeout(WAIT_S)
            assert sock.recv(100) == f"127.0.0.1:{sock.getsockname()[1]}".encode()
        for tcp, _ in accepted:
            await tcp.aclose()


async def test_wait_returns_once_a_connection_arrives() -> None:
    [listener] = await listen("127.0.0.1", 0, reuse_port=False)
    try:
        assert listener.accept_now() is None
        async with trio.open_nursery() as nursery:

            async def connect_later() -> None:
                await trio.sleep(0.05)
                stream = await trio.open_tcp_stream(*listener.address)
                await stream.aclose()

            nursery.start_soon(connect_later)
            with trio.fail_after(WAIT_S):
                await listener.wait()
            got = listener.accept_now()
            assert got is not None
            await got[0].aclose()
    finally:
        listener.close()


async def test_accept_forever_takes_bursts_longer_than_one_step_each_with_its_peer() -> None:
    taken: list[tuple[trio.SocketStream, str]] = []

    async def no_descriptors_expected(error: OSError) -> None:
        raise AssertionError(f"out of descriptors: {error}")

    async with connected(3 * BURST) as (listener, clients):
        with trio.move_on_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    accept_forever, listener, lambda tcp, peer: taken.append((tcp, peer)), no_descriptors_expected
                )
                while len(taken) < len(clients):
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        assert {peer for _, peer in taken} == peers_of(clients)
        for tcp, _ in taken:
            await tcp.aclose()


def test_the_daemon_logs_each_execution_with_its_peer() -> None:
    """The address comes from accept, no longer asked of the kernel again."""
    with running_daemon() as d, contextlib.ExitStack() as stack:
        hosts = [stack.enter_context(client(d.url)) for _ in range(40)]  # all connected before any executes
        peers = {f"127.0.0.1:{ws.local_address[1]}" for ws in hosts}
        for index, ws in enumerate(hosts):
            assert run_to_done(ws, f"e{index}", "await tools.echo(6) * 7")["result"] == 42
        deadline = time.monotonic() + WAIT_S
        logged: set[str] = set()
        while time.monotonic() < deadline and logged != peers:
            lines = [json.loads(line) for line in d.log_lines() if line.startswith("{")]
            logged = {line["peer"] for line in lines if "execution_id" in line}
            time.sleep(0.05)
        assert logged == peers
