"""Zygote renewal: every worker is a copy of its zygote, with its address-space layout, so after a
worker dies of a fault signal (a crash, perhaps an exploit probing the layout) the next workers
come from a new zygote, with a new layout; so they do after every ``renew_after_forks`` forks. No
fork request and no worker's exit status is lost, and no zygote is left a zombie. Real daemons,
real pools, real signals."""

from __future__ import annotations

import logging
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio

from .daemonkit import Daemon, children_of, client, process_state, run_to_done, running_daemon
from .poolkit import Execution, running_pool, running_zygote
from .test_reaping import wait_until
from .test_spares import spares_back
from .test_worker_exits import exit_line

WAIT_S = 10.0  # a bound on how long a renewal or an exit may take, not a measurement
ADDR_NO_RANDOMIZE = 0x0040000  # personality(2): this process and its children get no ASLR


def aslr_on() -> None:
    """Renewal gives a new layout only where the kernel randomises layouts: a new process's
    libraries, heap and stack are placed anew when ``randomize_va_space`` is 1 or 2 and the
    personality does not turn it off. A machine that runs untrusted code without it is
    misconfigured, and this test says so rather than passing for nothing."""
    setting = Path("/proc/sys/kernel/randomize_va_space").read_text().strip()
    assert setting != "0", "ASLR is off (kernel.randomize_va_space = 0): every process has the same layout"
    personality = int(Path("/proc/self/personality").read_text(), 16)
    assert not personality & ADDR_NO_RANDOMIZE, "this process runs without ASLR (setarch -R)"


def libc_start(pid: int) -> int | None:
    """Where the C library is mapped in ``pid``: placed anew by ASLR in each new program, the same in
    every copy of one made by fork. None for a process exiting (its maps are empty) or gone."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) == 6 and Path(fields[5]).name.startswith("libc"):
                    return int(fields[0].split("-")[0], 16)
    except OSError:
        pass
    return None


def zygotes(daemon: Daemon) -> list[int]:
    """The daemon's children that have children: its zygotes (orphaned workers have none)."""
    return [pid for pid in children_of(daemon.process.pid) if children_of(pid)]


def renewal_lines(daemon: Daemon, wait: bool) -> list[dict[str, Any]]:
    """The daemon's lines saying a zygote was renewed; with ``wait``, once there is one (bounded)."""
    lines = daemon.json_lines((lambda lines: any("renewal_reason" in line for line in lines)) if wait else None)
    return [line for line in lines if "renewal_reason" in line]


def metric(daemon: Daemon, name: str) -> list[str]:
    with urllib.request.urlopen(
        daemon.url.replace("ws://", "http://").rstrip("/") + "/metrics", timeout=WAIT_S
    ) as answer:
        return [line for line in answer.read().decode().splitlines() if line.startswith(name)]


@pytest.mark.parametrize("profile", ["standard", "hardened"])
def test_a_crashed_worker_has_the_next_workers_forked_from_a_new_zygote(profile: str) -> None:
    aslr_on()
    with running_daemon("--warm-workers", "2", "--profile", profile) as daemon:
        assert wait_until(lambda: len(zygotes(daemon)) == 1 and len(daemon.workers()) >= 2)
        (old_zygote,) = zygotes(daemon)
        old_workers = children_of(old_zygote)
        crashed = old_workers[0]
        old_layout = libc_start(old_zygote)
        assert old_layout is not None
        assert {libc_start(worker) for worker in old_workers} == {old_layout}  # copies of their zygote
        os.kill(crashed, signal.SIGSEGV)

        # The old zygote is retired: it exits and is reaped (no zombie); a new one forks the workers.
        assert wait_until(lambda: process_state(old_zygote) == "gone" and len(zygotes(daemon)) == 1)
        (new_zygote,) = zygotes(daemon)
        assert new_zygote != old_zygote
        assert [pid for pid in children_of(daemon.process.pid) if process_state(pid) == "Z"] == []
        new_layout = libc_start(new_zygote)
        assert new_layout is not None and new_layout != old_layout
        new_workers = children_of(new_zygote)  # spares, idle: none exits now
        assert new_workers and not set(new_workers) & set(old_workers)
        assert {libc_start(worker) for worker in new_workers} == {new_layout}
        with client(daemon.url) as ws:
            for index in range(3):
                assert run_to_done(ws, f"after-{index}", "40 + 2")["result"] == 42
        assert zygotes(daemon) == [new_zygote]

        # No exit status was lost: the crash is named, the old zygote's other workers were retired.
        assert exit_line(daemon, crashed)["exit_reason"] == "signal_SIGSEGV"
        assert {exit_line(daemon, worker)["exit_reason"] for worker in old_workers[1:]} == {"zygote_renewed"}
        (renewal,) = renewal_lines(daemon, wait=True)
        assert (renewal["level"], renewal["zygote_pid"], renewal["renewal_reason"]) == (
            "info",
            old_zygote,
            "worker_crash",
        )
        assert f"worker {crashed} died of SIGSEGV" in str(renewal["message"])
        assert metric(daemon, "execbox_zygote_renewals_total") == [
            'execbox_zygote_renewals_total{reason="fork_count"} 0.0',
            'execbox_zygote_renewals_total{reason="worker_crash"} 1.0',
        ]


@pytest.mark.parametrize("profile", ["standard", "hardened"])
def test_a_worker_killed_with_sigkill_does_not_renew_the_zygote(profile: str) -> None:
    """SIGKILL is the daemon's own kill, the OOM killer's or the CPU-time backstop's: no crash."""
    with running_daemon("--warm-workers", "2", "--profile", profile) as daemon:
        assert wait_until(lambda: len(zygotes(daemon)) == 1 and len(daemon.workers()) >= 2)
        (zygote,) = zygotes(daemon)
        killed = children_of(zygote)[0]
        os.kill(killed, signal.SIGKILL)
        assert exit_line(daemon, killed)["exit_reason"] == "signal_SIGKILL"
        with client(daemon.url) as ws:  # in hardened, each a new worker: forks after the kill
            for index in range(3):
                assert run_to_done(ws, f"after-{index}", "40 + 2")["result"] == 42
        assert zygotes(daemon) == [zygote]
        assert renewal_lines(daemon, wait=False) == []
        assert metric(daemon, "execbox_zygote_renewals_total") == [
            'execbox_zygote_renewals_total{reason="fork_count"} 0.0',
            'execbox_zygote_renewals_total{reason="worker_crash"} 0.0',
        ]


async def test_a_zygote_is_renewed_after_its_count_of_forks_and_no_request_or_status_is_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Forks asked together across renewals each get a worker; a retired zygote exits once it has
    answered, its live workers come back to this process (a subreaper, as the daemon is), and how
    they end still reaches the client."""
    caplog.set_level(logging.INFO, logger="execbox_runner.daemon.pool.zygote_client")
    async with running_zygote(renew_after_forks=3) as forks:
        zygote = forks.zygote
        first = zygote.process
        assert first is not None
        await forks.fork(8)
        pids = {pid for pid, _ in forks.forked}
        assert len(pids) == 8
        assert zygote.renewals == {"fork_count": 2, "worker_crash": 0}
        assert [getattr(record, "renewal_reason", None) for record in caplog.records] == ["fork_count"] * 2
        assert zygote.process is not first and zygote.process.returncode is None
        # The zygotes retired have exited and been reaped; their workers are ours now.
        with trio.fail_after(WAIT_S):
            while first.returncode is None or len(zygote.pids) > 1:
                await trio.sleep(0.02)
        assert first.returncode == 0 and process_state(first.pid) == "gone"
        orphans = [pid for pid in children_of(os.getpid()) if pid in pids]
        current = children_of(zygote.process.pid)
        assert (len(orphans), len(current)) == (6, 2) and set(orphans) | set(current) == pids
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        statuses = [await zygote.exit_status(pid) for pid in pids]  # each within STATUS_WAIT_S
        assert [status is not None and os.WTERMSIG(status) for status, _, _ in statuses] == [signal.SIGKILL] * 8
        # And what each spent, as its zygote or (an orphan) the reaper learned it reaping it: its start's CPU.
        assert all(cpu is not None and 0 < cpu < 60 for _, _, cpu in statuses), statuses


async def test_a_worker_forked_before_the_crash_was_known_takes_no_execution() -> None:
    """The zygote, stopped, has a fork request waiting when one of its workers crashes: it forks that
    worker (the old layout) as it resumes, and the pool retires it as it becomes ready."""
    async with running_pool(warm=2) as pool:
        await spares_back(pool, 2)
        old_zygote = pool.zygote.process
        assert old_zygote is not None
        crashed, other = list(pool.workers)
        os.kill(old_zygote.pid, signal.SIGSTOP)
        try:
            os.kill(crashed.pid, signal.SIGSEGV)
            with trio.fail_after(WAIT_S):  # its replacement is asked of the stopped zygote
                while not (pool.zygote._zygote and pool.zygote._zygote.forks):
                    await trio.sleep(0.01)
        finally:
            os.kill(old_zygote.pid, signal.SIGCONT)
        with trio.fail_after(WAIT_S):
            while pool.exit_reasons.get("zygote_renewed", 0) < 2:
                await trio.sleep(0.02)
        assert pool.exit_reasons == {"signal_SIGSEGV": 1, "zygote_renewed": 2}  # the other spare, the late one
        assert other.cause is not None and other.cause.reason == "zygote_renewed"
        await spares_back(pool, 2)
        execution = Execution(pool, "tenant")
        lease = await execution.leased()
        assert pool.zygote.process is not old_zygote and pool.zygote.process is not None
        assert children_of(pool.zygote.process.pid) and lease.worker.pid in children_of(pool.zygote.process.pid)
        pool.release(lease)
