"""A killed zygote leaves no zombies: the daemon reaps it and the workers that outlive it, and
still learns how each of those ended."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable

import trio

from execbox_runner.daemon.pool import reaper

from .daemonkit import children_of, client, process_state, run_to_done, running_daemon
from .test_worker_exits import exit_line

WAIT_S = 10.0  # a bound on how long reaping may take, not a measurement


def wait_until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_S
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def zombies(parent: int) -> list[int]:
    return [pid for pid in children_of(parent) if process_state(pid) == "Z"]


def test_the_daemon_reaps_a_killed_zygote_and_its_orphaned_workers() -> None:
    with running_daemon("--warm-workers", "2") as daemon:
        (zygote,) = children_of(daemon.process.pid)
        workers = children_of(zygote)
        assert len(workers) >= 2
        os.kill(zygote, signal.SIGKILL)
        # The workers come back to the daemon (a subreaper), not to PID 1, and keep serving.
        assert wait_until(
            lambda: process_state(zygote) == "gone" and set(workers) <= set(children_of(daemon.process.pid))
        )
        assert zombies(daemon.process.pid) == []
        with client(daemon.url) as ws:
            assert run_to_done(ws, "orphaned", "1 + 1")["result"] == 2
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)
        assert wait_until(lambda: all(process_state(worker) == "gone" for worker in workers))
        assert zombies(daemon.process.pid) == []
        # Their zygote could not report how they ended; the daemon, which reaped them, did.
        assert {exit_line(daemon, worker)["exit_reason"] for worker in workers} == {"signal_SIGKILL"}
        # New workers come from a new zygote, started on the pool's next fork.
        with client(daemon.url) as ws:
            for index in range(3):
                assert run_to_done(ws, f"after-{index}", "40 + 2")["result"] == 42
        (new_zygote,) = [pid for pid in children_of(daemon.process.pid) if children_of(pid)]
        assert new_zygote != zygote
        assert zombies(daemon.process.pid) == []


def test_a_sigchld_as_the_reaper_stops_is_no_error() -> None:
    """The reaper's receiver puts back a handler that does nothing, not the default action: CPython
    reports a SIGCHLD whose handler changed to the default before it ran as an error on stderr."""
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    unraisable: list[object] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    try:

        async def reap_briefly() -> None:
            with trio.move_on_after(0.05):
                await reaper.reap_on_exits(list)

        trio.run(reap_briefly)
        after = signal.getsignal(signal.SIGCHLD)
        assert callable(after) and after not in (signal.SIG_DFL, signal.SIG_IGN)
        os.kill(os.getpid(), signal.SIGCHLD)  # handled as any signal since: by the handler left in place
        time.sleep(0.01)
        assert unraisable == []
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGCHLD, previous)
