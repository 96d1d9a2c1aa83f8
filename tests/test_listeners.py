"""``listeners``: a burst of connections accepted in one step, each with its peer's address, over
real sockets on 127.0.0.1; what the acceptor does out of descriptors; and the daemon serving a
burst, each execution logged with its peer."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
from collections.abc import AsyncIterator
from typing import Any

import trio

from execbox_runner.daemon.net.listeners import BURST, Acceptor, Listener, listen
from execbox_runner.daemon.net.reactor import Reactor

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
        accepted: list[tuple[socket.socket, str]] = []
        with trio.fail_after(WAIT_S):
            while len(accepted) < len(clients):
                got = listener.accept_now()
                if got is None:
                    await trio.lowlevel.wait_readable(listener.fileno())
                else:
                    accepted.append(got)
        assert listener.accept_now() is None  # the queue is empty
        assert {peer for _, peer in accepted} == peers_of(clients)
        # Each one is a working non-blocking socket to its own client, with Nagle off (inherited).
        for sock, peer in accepted:
            assert sock.getblocking() is False
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            sock.send(peer.encode())
        for sock in clients:
            sock.settimeout(WAIT_S)
            assert sock.recv(100) == f"127.0.0.1:{sock.getsockname()[1]}".encode()
        for sock, _ in accepted:
            sock.close()


async def test_the_acceptor_takes_bursts_longer_than_one_step_each_with_its_peer() -> None:
    taken: list[tuple[socket.socket, str]] = []

    def no_descriptors_expected(error: OSError) -> bool:
        raise AssertionError(f"out of descriptors: {error}")

    reactor = Reactor()
    async with connected(3 * BURST) as (listener, clients):
        with trio.move_on_after(WAIT_S):
            async with trio.open_nursery() as nursery:
                Acceptor(reactor, listener, lambda sock, peer: taken.append((sock, peer)), no_descriptors_expected)
                nursery.start_soon(reactor.run)
                while len(taken) < len(clients):
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        reactor.unregister(listener.fileno())
        reactor.close()
        assert {peer for _, peer in taken} == peers_of(clients)
        for sock, _ in taken:
            sock.close()


async def test_out_of_descriptors_the_acceptor_frees_one_or_pauses() -> None:
    """A real EMFILE (the descriptor limit lowered to what is open now): a freed descriptor lets the
    next accept go on at once; none freed, accepting pauses, then resumes by itself."""
    reactor = Reactor()
    taken: list[socket.socket] = []  # kept open: each holds its descriptor
    fillers: list[int] = []  # every descriptor left below the lowered limit
    calls: list[bool] = []

    def out_of_descriptors(error: OSError) -> bool:
        assert error.errno == errno.EMFILE
        freed = not calls
        calls.append(freed)
        if freed:
            os.close(fillers.pop())
        else:  # nothing freed: give the limit back, so that the accept after the pause succeeds
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
        return freed

    def take(sock: socket.socket, _peer: str) -> None:
        taken.append(sock)

    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    async with connected(2) as (listener, clients):
        Acceptor(reactor, listener, take, out_of_descriptors)
        highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, limits[1]))
        try:
            with contextlib.suppress(OSError):
                while True:
                    fillers.append(os.open(os.devnull, os.O_RDONLY))
            with trio.move_on_after(WAIT_S):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(reactor.run)
                    while len(taken) < len(clients):
                        await trio.sleep(0.01)
                    nursery.cancel_scope.cancel()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            for fd in fillers:
                os.close(fd)
        reactor.unregister(listener.fileno())
        reactor.close()
        peers = {"{}:{}".format(*sock.getpeername()) for sock in taken}
        for sock in taken:
            sock.close()
        assert calls == [True, False] and peers == peers_of(clients)


def test_the_daemon_logs_each_execution_with_its_peer() -> None:
    """The address comes from accept, no longer asked of the kernel again."""
    with running_daemon() as d, contextlib.ExitStack() as stack:
        hosts = [stack.enter_context(client(d.url)) for _ in range(40)]  # all connected before any executes
        peers = {f"127.0.0.1:{ws.local_address[1]}" for ws in hosts}
        for index, ws in enumerate(hosts):
            assert run_to_done(ws, f"e{index}", "await tools.echo(6) * 7")["result"] == 42

        def logged(lines: list[dict[str, Any]]) -> set[str]:
            return {line["peer"] for line in lines if "execution_id" in line}

        assert logged(d.json_lines(until=lambda lines: logged(lines) == peers)) == peers
