"""Workers that host many executions: parked ones cost no process, tenants stay apart,
a spinning neighbour delays nobody, and a dead worker takes exactly its own executions."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from websockets.sync.client import ClientConnection

from .daemonkit import Daemon, client, cpu_ticks, execute, receive, run_to_done, running_daemon
from .test_worker_exits import exit_line

PARKED = "const r = await tools.hang({}); r + 1"


def bearer(token: str) -> dict[str, Any]:
    return {"additional_headers": {"Authorization": f"Bearer {token}"}}


def park(ws: ClientConnection, exec_id: str) -> dict[str, Any]:
    """Start an execution that awaits a tool; its tool_call."""
    ws.send(execute(exec_id, PARKED, timeoutMs=60_000))
    assert receive(ws)["type"] == "started"
    call = receive(ws)
    assert call["type"] == "tool_call"
    return call


def settle(ws: ClientConnection, call: dict[str, Any], value: int) -> dict[str, Any]:
    ws.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": value}))
    return receive(ws)


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tenants() -> Iterator[Daemon]:
    with running_daemon("--warm-workers", "1", "--tokens", "alpha,beta", "--worker-threads", "4") as d:
        yield d


def test_many_parked_executions_share_one_worker(tenants: Daemon) -> None:
    """60 executions parked at once hold slots in one worker, not 60 processes; all resume."""
    count = 60
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(16) as pool:
        connections = [stack.enter_context(client(tenants.url, **bearer("alpha"))) for _ in range(count)]
        calls = list(pool.map(lambda item: park(item[1], f"p{item[0]}"), enumerate(connections)))
        assert len(tenants.workers()) <= 3  # alpha's worker, a spare, perhaps a second spare starting
        dones = list(pool.map(lambda item: settle(connections[item[0]], item[1], item[0]), enumerate(calls)))
    assert [done["result"] for done in dones] == [index + 1 for index in range(count)]


def test_tenants_never_share_a_worker(tenants: Daemon) -> None:
    """alpha's execution burns CPU before it parks, so its worker is the one that burned; killing it
    ends alpha's execution and leaves beta's, which runs in a worker of its own, untouched."""
    with client(tenants.url, **bearer("alpha")) as a, client(tenants.url, **bearer("beta")) as b:
        before = {pid: cpu_ticks(pid) for pid in tenants.workers()}
        a.send(execute("a", "let x = 0; for (let i = 0; i < 3e7; i++) x += i; " + PARKED, timeoutMs=60_000))
        assert receive(a)["type"] == "started"
        assert receive(a, timeout=30)["type"] == "tool_call"
        call = park(b, "b")
        alpha_worker = max(tenants.workers(), key=lambda pid: cpu_ticks(pid) - before.get(pid, 0))
        os.kill(alpha_worker, signal.SIGKILL)
        done = receive(a)
        assert done["id"] == "a" and done["error"]["code"] == "internal_error"
        assert settle(b, call, 1)["result"] == 2


def test_a_spinning_neighbour_does_not_hold_up_a_parked_execution(tenants: Daemon) -> None:
    """Three guests spin in the same worker (4 runner threads); the fourth resumes and finishes first."""
    with contextlib.ExitStack() as stack:
        spinners = [stack.enter_context(client(tenants.url, **bearer("alpha"))) for _ in range(3)]
        for index, ws in enumerate(spinners):
            ws.send(execute(f"s{index}", "while (true) {}", timeoutMs=4000))
            assert receive(ws)["type"] == "started"
        with client(tenants.url, **bearer("alpha")) as parked:
            done = run_to_done(parked, "steps", "let n = 0; for (let i = 0; i < 5; i++) n += await tools.echo(i); n")
            assert done["result"] == 10
            for ws in spinners:  # still spinning when the parked one is done
                with pytest.raises(TimeoutError):
                    ws.recv(timeout=0)
        for index, ws in enumerate(spinners):
            assert receive(ws)["id"] == f"s{index}"


def test_a_killed_worker_ends_all_its_executions_and_is_replaced() -> None:
    """SIGKILL of a worker holding 100 parked executions: 100 internal_error dones; the next 100 succeed."""
    count = 100
    with running_daemon("--warm-workers", "1") as d:
        with contextlib.ExitStack() as stack, ThreadPoolExecutor(16) as pool:
            connections = [stack.enter_context(client(d.url)) for _ in range(count)]
            list(pool.map(lambda item: park(item[1], f"v{item[0]}"), enumerate(connections)))
            held = max(d.workers(), key=_rss)  # the worker whose runtimes hold the parked executions
            os.kill(held, signal.SIGKILL)
            dones = list(pool.map(receive, connections))
        assert {done["error"]["code"] for done in dones} == {"internal_error"}
        assert sorted(done["id"] for done in dones) == sorted(f"v{index}" for index in range(count))
        line = exit_line(d, held)
        assert (line["exit_reason"], line["executions_held"]) == ("signal_SIGKILL", count)
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda index: _one(d, index), range(count)))
        assert results == [index + 1 for index in range(count)]


def _one(d: Daemon, index: int) -> int:
    with client(d.url) as ws:
        return int(run_to_done(ws, f"n{index}", "await tools.echo(0) + 1 + " + str(index))["result"])


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1])
    except OSError:
        return 0


def ready(d: Daemon) -> bool:
    url = d.url.replace("ws://", "http://").rstrip("/") + "/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(json.loads(answer.read())["status"] == "ready")
    except OSError:
        return False


def test_a_worker_slow_to_let_go_of_an_aborted_execution_keeps_its_others() -> None:
    """A worker that cannot answer an abort in time (here: stopped, as a starved CPU would leave it)
    is retired, not killed: the execution it still hosts finishes normally once it runs again.

    No timing decides the outcome: the worker is the one spare of a ready daemon (the first
    execution claims it), and it stays stopped until the daemon has logged that it retires it."""
    with running_daemon("--warm-workers", "1") as d:
        wait_for(lambda: ready(d) and len(d.workers()) == 1, timeout=60)
        (host,) = d.workers()  # the one warm spare: the first execution claims it, the next joins it
        with client(d.url) as kept:
            call = park(kept, "kept")
            with client(d.url) as gone:
                park(gone, "gone")
                os.kill(host, signal.SIGSTOP)
                try:
                    gone.close()  # the host goes away: its execution is aborted and abandoned
                    retiring = f"worker {host} has not let go of an aborted execution; retiring it"
                    wait_for(lambda: any(line["message"] == retiring for line in d.json_lines()), timeout=60)
                    assert any(line["message"] == retiring for line in d.json_lines()), d.log_lines()[-5:]
                finally:
                    os.kill(host, signal.SIGCONT)
            assert settle(kept, call, 41)["result"] == 42
        wait_for(lambda: host not in d.workers(), timeout=30)  # retired: it ends with its last execution
        assert host not in d.workers()
        assert exit_line(d, host)["exit_reason"] == "slow_abort"
        with client(d.url) as after:  # new work goes elsewhere and runs
            assert run_to_done(after, "after", "await tools.echo(1) + 1")["result"] == 2
