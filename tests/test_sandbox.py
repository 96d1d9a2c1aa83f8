"""The worker sandbox, proven from inside a real confined worker process."""

from __future__ import annotations

import json
import mmap
import os
import socket
import subprocess
import sys
import weakref
from collections.abc import Iterator

import msgspec
import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import sandbox
from execbox_runner.worker.loop import recv_exactly

from .guestkit import run_message

CAPABILITIES = sandbox.capabilities()


def start_worker(*args: str) -> tuple[subprocess.Popen[bytes], socket.socket]:
    parent, child = socket.socketpair()
    process = subprocess.Popen(
        [sys.executable, "-m", "execbox_runner.worker.loop", str(child.fileno()), *args],
        pass_fds=(child.fileno(),),
        stdin=subprocess.DEVNULL,
        env={**os.environ, "MALLOC_ARENA_MAX": "1"},  # as the zygote runs: address space left under RLIMIT_AS
    )
    child.close()
    parent.settimeout(60)
    return process, parent


# Per channel and slot: log lines a worker streamed (messages of lines alone), not yet handed on.
_streamed: weakref.WeakKeyDictionary[socket.socket, dict[int, list[str]]] = weakref.WeakKeyDictionary()


def next_message(sock: socket.socket) -> tuple[int, ipc.FromWorker]:
    """The worker's next message as it was sent: streamed log lines (a ``ToolCalls`` without calls) too."""
    (length,) = ipc.HEADER.unpack(recv_exactly(sock, ipc.HEADER.size))
    slot, message = ipc.from_worker_decoder.decode(recv_exactly(sock, length))
    return slot, message


def receive_any(sock: socket.socket) -> tuple[int, ipc.FromWorker]:
    """The worker's next message, for whichever slot, with the log lines the worker streamed for that
    slot before it (while its guest ran, as they were written) folded into it."""
    streamed = _streamed.setdefault(sock, {})
    while True:
        slot, message = next_message(sock)
        if isinstance(message, ipc.ToolCalls) and not message.calls:
            streamed.setdefault(slot, []).extend(message.logs)
            continue
        if isinstance(message, ipc.ToolCalls | ipc.Finished) and slot in streamed:
            message = msgspec.structs.replace(message, logs=streamed.pop(slot) + message.logs)
        return slot, message


def receive(sock: socket.socket, slot: int = 0) -> ipc.FromWorker:
    """The worker's next message, which must be for ``slot``."""
    got, message = receive_any(sock)
    assert got == slot
    return message


@pytest.fixture(scope="module")
def probed() -> Iterator[tuple[ipc.Probed, int]]:
    process, sock = start_worker("--probe", "--max-memory", str(64 << 20), "--cpu-seconds", "10")
    with sock:
        report = receive(sock)
    process.wait(timeout=60)
    assert isinstance(report, ipc.Probed)
    yield report, process.pid


@pytest.mark.parametrize(
    "action",
    [
        "read_file",
        "write_file",
        "list_directory",
        "socket",
        "unix_socket",
        "fork",
        "exec",
        "subprocess",
        "signal_init",
        "ptrace_init",
        "unshare",
        "mount",
        "raise_nofile",
        "raise_cpu",
        "lower_cpu",
    ],
)
def test_the_confined_worker_cannot(probed: tuple[ipc.Probed, int], action: str) -> None:
    if not CAPABILITIES.seccomp:
        pytest.skip("seccomp is not available on this host")
    outcome = probed[0].outcomes[action]
    assert outcome.startswith("blocked"), f"{action}: {outcome}"


def test_process_limits_hold_in_the_worker(probed: tuple[ipc.Probed, int]) -> None:
    outcomes = probed[0].outcomes
    assert outcomes["rlimit_fsize"] == "0" and outcomes["rlimit_core"] == "0"
    assert int(outcomes["rlimit_nofile"]) <= 16
    address_space = int(outcomes["rlimit_as"])
    assert 64 << 20 < address_space < 8 << 30  # above the QuickJS limit, far below unlimited
    assert 10 <= int(outcomes["rlimit_cpu"]) <= 60
    assert outcomes["rlimit_cpu_hard"] == outcomes["rlimit_cpu"]  # the backstop cannot be lifted


@pytest.mark.parametrize("action", ["map_executable", "protect_executable", "write_code"])
def test_the_confined_worker_cannot_make_memory_executable(probed: tuple[ipc.Probed, int], action: str) -> None:
    """W^X: no new executable mapping (an injected payload has nowhere to run) and no code page made writable."""
    if not CAPABILITIES.seccomp:
        pytest.skip("seccomp is not available on this host")
    assert probed[0].outcomes[action] == "blocked: EPERM"


def test_the_confined_worker_can_fault_its_heap_in(probed: tuple[ipc.Probed, int]) -> None:
    """The prefault thread's madvise(MADV_POPULATE_WRITE) passes the seccomp filter: a filter that
    refused it would cost every runtime ~45 page faults without a word."""
    assert probed[0].outcomes["populate_memory"] == "allowed"


def test_a_ready_worker_has_no_writable_code() -> None:
    """The ctypes callback page, writable and executable when made, is sealed before guest code runs."""
    process, sock = start_worker("--max-memory", str(64 << 20))
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        with open(f"/proc/{process.pid}/maps") as maps:
            writable_code = [line for line in maps if {"w", "x"} <= set(line.split()[1])]
        assert writable_code == []
    process.wait(timeout=30)


def test_the_kernel_names_the_same_writable_code_as_the_maps_file() -> None:
    """What ``PROCMAP_QUERY`` answers (None: a kernel without it) is what reading the file finds."""
    writable = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)  # writable code
    try:
        fd = os.open("/proc/self/maps", os.O_RDONLY)
        try:
            asked = sandbox._writable_executable(fd)
        finally:
            os.close(fd)
        with open("/proc/self/maps") as maps:
            spans = [line.split()[0] for line in maps if {"w", "x"} <= set(line.split()[1])]
        read = [tuple(int(address, 16) for address in span.split("-")) for span in spans]
        assert asked is None or asked == read
        assert asked is None or asked  # the page made here is among them
    finally:
        writable.close()


def test_the_worker_drops_root_and_leaves_the_network(probed: tuple[ipc.Probed, int]) -> None:
    report, _ = probed
    if not CAPABILITIES.running_as_root:
        pytest.skip("not running as root: nothing to drop, and no network namespace without privileges")
    assert report.outcomes["uid"] == str(sandbox.NOBODY)
    assert "network_namespace" not in report.missing, "could not create a network namespace on this host"
    assert report.outcomes["network"] == CAPABILITIES.network_mechanism == "netns"  # root needs no user namespace
    assert report.missing == []


def test_a_worker_keeps_only_its_channel(tmp_path: object) -> None:
    """Inherited descriptors are closed: the worker sees none but its channel, and the timer it
    made itself (its runners' alarm)."""
    extra = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(extra, True)
    try:
        process, sock = start_worker("--max-memory", str(64 << 20))
        with sock:
            assert isinstance(receive(sock), ipc.Ready)
            fds = sorted(os.readlink(f"/proc/{process.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{process.pid}/fd"))
            assert len(fds) == 2 and fds[0] == "anon_inode:[timerfd]" and fds[1].startswith("socket:"), fds
            if CAPABILITIES.network_namespace:
                assert os.readlink(f"/proc/{process.pid}/ns/net") != os.readlink("/proc/self/ns/net")
        process.wait(timeout=30)
    finally:
        os.close(extra)


def test_a_sandboxed_worker_runs_guest_code_normally() -> None:
    process, sock = start_worker("--max-memory", str(64 << 20))
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        run = run_message(
            "console.log('hi'); const r = await t.e({ a: 1 }); r.a + 1", providers=[("t", ["e"])], memory=32 << 20
        )
        sock.sendall(ipc.frame(1, run))
        calls = receive(sock, 1)
        assert isinstance(calls, ipc.ToolCalls) and calls.logs == ["hi"]
        sock.sendall(ipc.frame(1, ipc.Settle(call_id=calls.calls[0][0], ok=True, value=b'{"a": 41}')))
        finished = receive(sock, 1)
        assert isinstance(finished, ipc.Finished) and finished.result == b"42"
        sock.sendall(
            ipc.frame(2, run_message("const a = []; while (true) a.push(new Array(1000).fill(1))", memory=32 << 20))
        )
        assert receive(sock, 2).code == "memory_limit"
    process.wait(timeout=30)


def spin_run(budget_s: float) -> ipc.Run:
    return run_message("while (true) {}", budget=budget_s, memory=32 << 20)


def test_an_execution_aborted_before_it_started_is_answered_while_the_runners_are_busy() -> None:
    """With its only runner held by a spinning guest, a queued execution's Abort still gets its
    Finished at once (from the reading thread), not after the spinner ends."""
    process, sock = start_worker("--max-memory", str(64 << 20), "--threads", "1")
    with sock:
        assert isinstance(receive(sock), ipc.Ready)
        sock.sendall(ipc.frame(1, spin_run(30)) + ipc.frame(2, spin_run(30)) + ipc.frame(2, ipc.Abort()))
        first = receive(sock, 2)
        assert isinstance(first, ipc.Finished) and first.code == "timeout"
        sock.sendall(ipc.frame(1, ipc.Abort()))
        assert receive(sock, 1).code == "timeout"  # type: ignore[union-attr]
    process.wait(timeout=30)


def test_info_reports_what_this_host_enforces() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "info", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    report = json.loads(out)
    protections = report["protections"]
    assert protections["seccomp"] == {"requested": True, "enforced": CAPABILITIES.seccomp}
    assert protections["network_namespace"]["enforced"] == CAPABILITIES.network_namespace
    assert report["limits"]["max_memory_limit_bytes"] == 512 << 20
    assert report["warnings"] == sandbox.warnings(protections)
    assert report["network_mechanism"] == CAPABILITIES.network_mechanism
    off = json.loads(
        subprocess.run(
            [sys.executable, "-m", "execbox_runner", "info", "--json", "--sandbox", "false"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    assert not any(state["requested"] for state in off["protections"].values()) and off["warnings"] == []


def test_each_unenforceable_protection_gets_a_warning() -> None:
    report = {
        "seccomp": {"requested": True, "enforced": False},
        "rlimits": {"requested": True, "enforced": True},
        "network_namespace": {"requested": False, "enforced": False},
    }
    assert sandbox.warnings(report) == ["worker protection 'seccomp' was requested but cannot be enforced on this host"]
