"""Scale-out: two replicas behind a plain round-robin balancer, one of them stopped mid-load.

Each execution is one WebSocket session, so any replica can take any session and no stickiness is
needed; what a replica's loss costs is the sessions it held. The balancer here is the simplest
there is (TCP, each new connection to the next replica in turn, no health checks), so the stopped
replica stays in rotation and clients meet its refusals. The hosts retry an execution from the
start on a 503, a refused or closed connection, or a session lost before its `done`: every
execution completes, and no session on the surviving replica loses its `done`. With SIGTERM (a
rollout, a scale-in) the stopped replica drains, so even its own sessions in flight finish; with
SIGKILL (a crash) those are lost and retried elsewhere."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from .daemonkit import children_of, execute, running_daemon

HOSTS = 8
EXECUTIONS = 30  # per host
ATTEMPTS = 40  # per execution, at most
DEADLINE_S = 120.0


class RoundRobin:
    """A TCP balancer on 127.0.0.1: each new connection goes to the next backend in turn. One that
    refuses gets the client's connection closed (as a balancer without health checks does), and
    the client sees the failure. ``routes`` maps each client's port to the backend it was given."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.routes: dict[int, int] = {}
        self._next = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> RoundRobin:
        self._start(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        self._listener.close()

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                downstream, peer = self._listener.accept()
            except TimeoutError:
                continue
            index = self._next % len(self.backends)
            self._next += 1
            self.routes[peer[1]] = index
            try:
                upstream = socket.create_connection(("127.0.0.1", self.backends[index]), timeout=5)
            except OSError:
                downstream.close()
                continue
            for source, sink in ((downstream, upstream), (upstream, downstream)):
                self._start(self._pump, source, sink)

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        source.settimeout(0.2)
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                try:
                    data = source.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            source.close()


@dataclass
class Attempt:
    execution: str
    backend: int = -1
    outcome: str = "started"  # then: in flight, done, 503, refused: ..., lost
    in_flight_at: float = 0.0  # when its tool call arrived
    ended_at: float = 0.0


@dataclass
class Load:
    """The hosts' side: each execution from the start until a `done`, retried on a failure. A host
    answers a tool call only while ``answering`` is set, so that the test can hold sessions in
    flight on both replicas while it stops one."""

    balancer: RoundRobin
    attempts: list[Attempt] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answering: threading.Event = field(default_factory=threading.Event)

    def with_outcome(self, outcome: str, backend: int | None = None) -> list[Attempt]:
        with self.lock:
            return [a for a in self.attempts if a.outcome == outcome and backend in (None, a.backend)]

    def run(self, execution: str, value: int) -> int:
        for _ in range(ATTEMPTS):
            attempt = Attempt(execution)
            with self.lock:
                self.attempts.append(attempt)
            result = self._once(attempt, value)
            attempt.ended_at = time.monotonic()
            if result is not None:
                return result
            time.sleep(0.05)
        raise AssertionError(f"{execution}: no done in {ATTEMPTS} attempts")

    def _once(self, attempt: Attempt, value: int) -> int | None:
        sock = socket.create_connection(("127.0.0.1", self.balancer.port), timeout=10)
        local = sock.getsockname()[1]
        try:
            with connect(f"ws://127.0.0.1:{self.balancer.port}/", sock=sock, open_timeout=10, close_timeout=5) as ws:
                ws.send(execute(attempt.execution, "(await tools.echo(0)) + " + str(value), timeoutMs=30_000))
                while True:
                    message = json.loads(ws.recv(timeout=DEADLINE_S))
                    if message["type"] == "tool_call":
                        attempt.backend = self.balancer.routes[local]
                        attempt.outcome, attempt.in_flight_at = "in flight", time.monotonic()
                        assert self.answering.wait(DEADLINE_S)
                        answer = {"type": "tool_result", "callId": message["callId"], "ok": True, "result": 1}
                        ws.send(json.dumps(answer))
                    elif message["type"] == "done":
                        assert message["id"] == attempt.execution and "error" not in message, message
                        attempt.outcome = "done"
                        return int(message["result"])
        except InvalidStatus as exc:
            assert exc.response.status_code == 503, exc
            attempt.outcome = "503"
        except (InvalidHandshake, ConnectionClosed, OSError) as exc:  # closed by the balancer or the replica
            attempt.outcome = "lost" if attempt.outcome == "in flight" else f"refused: {type(exc).__name__}"
        finally:
            sock.close()
            attempt.backend = self.balancer.routes.get(local, -1)
        return None


@contextlib.contextmanager
def replicas() -> Iterator[list[tuple[int, int]]]:
    """Two daemons: (PID, port) each. Whatever of a stopped one's tree is left is killed by PID."""
    with running_daemon() as first, running_daemon() as second:
        daemons = [first, second]
        trees = [children_of(d.process.pid) for d in daemons]
        try:
            yield [(d.process.pid, int(d.url.rsplit(":", 1)[1].strip("/"))) for d in daemons]
        finally:
            for tree in trees:
                for pid in tree:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["drained", "crashed"])
def test_stopping_one_replica_mid_load_loses_no_execution(stop: signal.Signals) -> None:
    with replicas() as ((victim, first), (_, second)), RoundRobin([first, second]) as balancer:
        load = Load(balancer)
        load.answering.set()
        with ThreadPoolExecutor(HOSTS) as pool:
            runs = [
                pool.submit(load.run, f"h{host}-{index}", host * 1000 + index)
                for host in range(HOSTS)
                for index in range(EXECUTIONS)
            ]
            try:
                # Mid-load: some executions done, and both replicas holding sessions in flight,
                # which the hosts leave unanswered until the replica has been stopped.
                wait_for(lambda: len(load.with_outcome("done")) >= 2 * HOSTS)
                for _ in range(20):  # the sessions may all be on one replica: then again, a little later
                    load.answering.clear()
                    wait_for(lambda: len(load.with_outcome("in flight")) == HOSTS)
                    on_victim, on_survivor = load.with_outcome("in flight", 0), load.with_outcome("in flight", 1)
                    if on_victim and on_survivor:
                        break
                    load.answering.set()
                    wait_for(lambda: len(load.with_outcome("in flight")) < HOSTS)
                stopped_at = time.monotonic()
                os.kill(victim, stop)
                if stop == signal.SIGTERM:  # its sessions in flight get their answers while it drains
                    wait_for(lambda: readiness(first) == "draining")
            finally:
                load.answering.set()
            results = [run.result(timeout=DEADLINE_S) for run in runs]
    # Every execution completed, each with its own answer.
    assert results == [host * 1000 + index + 1 for host in range(HOSTS) for index in range(EXECUTIONS)]
    outcomes = Counter((a.backend, a.outcome) for a in load.attempts)
    assert on_victim and on_survivor, outcomes  # stopped mid-load: both held sessions in flight
    assert all(a.backend in (0, 1) for a in load.attempts), outcomes
    # The survivor lost no done: every session that reached it ended with its done.
    assert {outcome for backend, outcome in outcomes if backend == 1} == {"done"}, outcomes
    # The stopped replica: drained, its sessions in flight finished; crashed, they were lost and retried.
    assert {a.outcome for a in on_victim} == {"done" if stop == signal.SIGTERM else "lost"}, outcomes
    after = [a for a in load.attempts if a.backend == 0 and a.in_flight_at == 0.0 and a.ended_at > stopped_at]
    assert after, outcomes  # hosts still met the stopped replica, and retried elsewhere
    assert all(a.outcome == "503" or a.outcome.startswith("refused") for a in after), outcomes


def readiness(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return str(json.loads(answer.read())["status"])
    except urllib.error.HTTPError as exc:
        return str(json.loads(exc.read())["status"])
    except OSError as exc:
        return f"no answer: {exc}"


def wait_for(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
