"""A network boundary without root (issue 14 §3): a daemon that is not root gives its workers a
network namespace inside an unprivileged user namespace, proven with real processes run as
``nobody``. Root only (to become nobody, and to look into the namespaces from outside)."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import platform
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import sandbox, seccomp

from . import otheruser
from .daemonkit import _listening_url, children_of, client, run_to_done, stop
from .test_sandbox import receive

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: to run processes as nobody and enter their namespaces"
)

NOBODY = sandbox.NOBODY
UNSHARE_X86_64 = 272
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

# Run a command as nobody with no capabilities and no_new_privs (the restricted pod's user), in a
# private mount namespace in which nobody can reach this checkout and its interpreter (otheruser.py).
AS_NOBODY = (
    otheruser.REACH
    + r"""
set -e
mount --make-rprivate /
reach "$STAGE"
exec setpriv --reuid 65534 --regid 65534 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \
    env HOME=/nonexistent "$@"
"""
)


def in_child(action: Callable[[], str], *, nobody: bool = False) -> str:
    """``action``'s answer, computed in a forked child (single-threaded, as ``isolate`` needs);
    as nobody with no capabilities if asked. An exception is the answer, so a test shows it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            if nobody:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            answer = action()
        except BaseException as exc:
            answer = f"raised {exc!r}"
        os.write(write_end, answer.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        answer = reader.read()
    os.waitpid(pid, 0)
    return answer


def kernel_allows_unprivileged_userns() -> str:
    """What the kernel itself answers nobody asking for a user and a network namespace (no sandbox code)."""

    def attempt() -> str:
        libc = ctypes.CDLL(None, use_errno=True)
        return (
            "yes"
            if libc.unshare(sandbox.CLONE_NEWUSER | sandbox.CLONE_NEWNET) == 0
            else os.strerror(ctypes.get_errno())
        )

    return in_child(attempt, nobody=True)


def require_unprivileged_userns() -> None:
    answer = kernel_allows_unprivileged_userns()
    if answer != "yes":
        settings = {
            name: Path(path).read_text().strip() if Path(path).exists() else "absent"
            for name, path in (
                ("user.max_user_namespaces", "/proc/sys/user/max_user_namespaces"),
                ("kernel.unprivileged_userns_clone", "/proc/sys/kernel/unprivileged_userns_clone"),
                (
                    "kernel.apparmor_restrict_unprivileged_userns",
                    "/proc/sys/kernel/apparmor_restrict_unprivileged_userns",
                ),
            )
        }
        pytest.skip(
            f"this kernel refuses nobody a user namespace ({answer}; {settings}): the daemon reports 'none' here"
        )


def connect(address: tuple[str, int] | str, family: int = socket.AF_INET) -> str:
    """``connected``, or the errno name of the failure."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(address)
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    return "connected"


def enter_network_of(pid: int, address: tuple[str, int]) -> str:
    """From a child that joined ``pid``'s network namespace (as root, from outside): connect to ``address``."""

    def attempt() -> str:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
        if ctypes.CDLL(None, use_errno=True).setns(fd, sandbox.CLONE_NEWNET) != 0:
            return f"setns: {os.strerror(ctypes.get_errno())}"
        return connect(address)

    return in_child(attempt)


def status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as lines:
        return dict(line.rstrip("\n").split(":\t", 1) for line in lines)


def namespace(pid: int | str, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


@pytest.fixture
def listener() -> Iterator[tuple[str, int]]:
    """A TCP listener on 127.0.0.1 in this (the host's) network namespace."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        yield sock.getsockname()


def as_nobody(command: list[str], tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """``command`` wrapped to run as nobody (see ``AS_NOBODY``), and the environment it needs."""
    paths = otheruser.needed()
    closed = otheruser.closed_tree(paths)
    if closed:
        pytest.fail(f"nobody cannot run this checkout: {closed}")
    stage = tmp_path / "stage"
    stage.mkdir()
    env = {**os.environ, **otheruser.environment(paths, stage), "STAGE": str(stage)}
    return ["unshare", "-m", "sh", "-c", AS_NOBODY, "as-nobody", *command], env


def test_the_mechanism_is_netns_as_root_and_none_without_the_sandbox() -> None:
    assert sandbox.capabilities().network_mechanism == "netns"
    assert sandbox.network_mechanism(True) == "netns"
    assert sandbox.network_mechanism(False) == "none"
    assert set(sandbox.NETWORK_MECHANISMS) == {"netns", "userns+netns", "none"}


def test_a_non_root_daemon_reports_the_mechanism_the_kernel_allows_it() -> None:
    """Whatever this host allows: a user namespace where the kernel gives nobody one, else none."""
    expected = "userns+netns" if kernel_allows_unprivileged_userns() == "yes" else "none"
    found = json.loads(
        in_child(
            lambda: json.dumps(
                [sandbox.network_mechanism(True), sandbox.capabilities().network_namespace, sandbox.enforcement(True)]
            ),
            nobody=True,
        )
    )
    assert found[:2] == [expected, expected != "none"]
    assert found[2]["network_namespace"] == {"requested": True, "enforced": expected != "none"}
    assert found[2]["drop_privileges"] == {"requested": False, "enforced": False}


@pytest.mark.parametrize("threaded", [False, True], ids=["single-threaded", "with a thread, as the zygote"])
def test_an_escaped_non_root_worker_cannot_reach_a_loopback_listener_of_the_host(
    listener: tuple[str, int], threaded: bool
) -> None:
    """The namespace alone, without seccomp (as guest code that got past both would be): after
    ``isolate`` as nobody, neither the host's loopback nor its abstract Unix sockets answer, ids look
    unchanged, and no capability is left from the user namespace. A process with threads stays
    outside itself, and the child it forks next is where all that holds."""
    require_unprivileged_userns()
    abstract = f"\0execbox-userns-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix_listener:
        unix_listener.bind(abstract)
        unix_listener.listen(8)

        def reach() -> list[str]:
            return [connect(listener), connect(abstract, socket.AF_UNIX)]

        def inside() -> str:
            capabilities = {key: value for key, value in status(os.getpid()).items() if key.startswith("Cap")}
            ids = [os.getuid(), os.geteuid(), os.getgid(), os.getegid()]
            return json.dumps([sandbox._isolated, sandbox._network, ids, capabilities, reach()])

        def escape() -> str:
            before = reach()
            stop = threading.Event()
            if threaded:
                threading.Thread(target=stop.wait, daemon=True).start()
            itself = [sandbox.isolate(), sandbox._network]
            found = in_child(inside) if threaded else inside()
            stop.set()
            return json.dumps([before, itself, json.loads(found)])

        before, itself, (missing, network, ids, capabilities, after) = json.loads(in_child(escape, nobody=True))
    assert before == ["connected", "connected"]  # reachable as nobody from the host's namespace
    assert itself == ([["network_namespace"], "none"] if threaded else [[], "userns+netns"])
    assert (missing, network) == ([], "userns+netns")
    assert ids == [NOBODY] * 4  # mapped to themselves
    assert set(capabilities.values()) == {"0000000000000000"}, capabilities
    assert after == ["ENETUNREACH", "ECONNREFUSED"]  # no loopback up; another namespace's abstract sockets


def refuse_unshare() -> None:
    """From now on unshare(2) fails with EPERM in this process and its children (a seccomp filter,
    as a container runtime's profile would)."""
    program = b"".join(
        struct.pack("HBBI", code, true, false, k)
        for code, true, false, k in (
            (0x20, 0, 0, 0),  # load the system call number
            (0x15, 0, 1, UNSHARE_X86_64),  # unshare?
            (0x06, 0, 0, 0x00050000 | errno.EPERM),  # then fail with EPERM
            (0x06, 0, 0, 0x7FFF0000),  # else allow
        )
    )
    buffer = ctypes.create_string_buffer(program)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(seccomp.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    assert libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog)) == 0, ctypes.get_errno()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the filter refusing unshare is written for x86-64")
def test_a_worker_that_cannot_make_its_namespace_exits_rather_than_run_without_it() -> None:
    """Fail closed: once a process with threads was found able to give its children a user and network
    namespace, a child that cannot make one (here a seccomp filter refuses it) exits at once."""
    require_unprivileged_userns()

    def attempt() -> str:
        stop = threading.Event()
        threading.Thread(target=stop.wait, daemon=True).start()
        missing = sandbox.isolate()  # this process stays outside; its children would make their own
        refuse_unshare()
        pid = os.fork()
        if pid == 0:
            os._exit(0)  # only if the child got past making its namespace
        stop.set()
        return json.dumps([missing, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])])

    assert json.loads(in_child(attempt, nobody=True)) == [["network_namespace"], sandbox.ISOLATION_FAILED]


def test_a_zygote_started_non_root_gives_each_worker_a_user_and_network_namespace(tmp_path: Path) -> None:
    """The production path: the zygote (which has a thread) stays outside and never runs guest code;
    the worker it forks makes its namespaces, confines itself on top, and reports what it can still do."""
    require_unprivileged_userns()
    control, zygote_end = socket.socketpair()
    command, env = as_nobody(
        [sys.executable, "-m", "execbox_runner.worker.zygote", str(zygote_end.fileno()), "--probe"], tmp_path
    )
    process = subprocess.Popen(command, env=env, pass_fds=(zygote_end.fileno(),), stdin=subprocess.DEVNULL, text=True)
    zygote_end.close()
    try:
        with control:
            control.settimeout(60)
            parent, child = socket.socketpair()
            with parent:
                socket.send_fds(control, [b"\0"], [child.fileno()])  # fork a worker on this channel
                child.close()
                parent.settimeout(60)
                report = receive(parent)
            zygote = status(process.pid)
            assert zygote["Uid"].split() == [str(NOBODY)] * 4 and zygote["NoNewPrivs"] == "1"
            assert {zygote[key] for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}
            assert [namespace(process.pid, kind) for kind in ("user", "net")] == [
                namespace("self", kind) for kind in ("user", "net")
            ]
        assert isinstance(report, ipc.Probed)
        assert report.missing == []
        outcomes = report.outcomes
        assert (outcomes["network"], outcomes["uid"]) == ("userns+netns", str(NOBODY))
        for action in ("socket", "unix_socket", "unshare", "mount", "fork", "exec", "ptrace_init", "read_file"):
            assert outcomes[action] == "blocked: EPERM", f"{action}: {outcomes[action]}"
    finally:
        stop(process)


def test_a_non_root_daemon_runs_guest_code_in_workers_off_the_network(
    listener: tuple[str, int], tmp_path: Path
) -> None:
    """``execbox-runner serve`` as nobody: it reports the namespace enforced (no ``no_network_namespace``),
    runs an execution, and each worker is in its own user and network namespace, with no capability,
    from which the host's loopback listener cannot be reached; the daemon stays in the host's."""
    require_unprivileged_userns()
    command, env = as_nobody(
        [sys.executable, "-m", "execbox_runner", "serve", "--host", "127.0.0.1", "--port", "0", "--processes", "1"],
        tmp_path,
    )
    with (tmp_path / "stderr").open("w+") as stderr:
        process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        try:
            url = _listening_url(process, stderr)
            with urllib.request.urlopen(url.replace("ws://", "http://").rstrip("/") + "/healthz", timeout=10) as answer:
                health = json.loads(answer.read())
            assert health["protections"]["network_namespace"] == {"requested": True, "enforced": True}
            assert "no_network_namespace" not in health["unsafe_settings"]
            assert health["network_mechanism"] == "userns+netns"
            with client(url) as ws:
                assert run_to_done(ws, "userns", "await tools.echo(6 * 7)")["result"] == 42
                (zygote,) = children_of(process.pid)
                workers = children_of(zygote)
                assert workers
                for pid in workers:
                    found = status(pid)
                    assert found["Uid"].split() == [str(NOBODY)] * 4
                    assert {found[key] for key in ("CapPrm", "CapEff", "CapBnd")} == {"0000000000000000"}
                    for kind in ("user", "net"):
                        assert namespace(pid, kind) != namespace(process.pid, kind), kind
                    assert enter_network_of(pid, listener) == "ENETUNREACH"
                assert namespace(process.pid, "net") == namespace("self", "net")
                assert connect(listener) == "connected"  # the same listener, from the host's namespace
        finally:
            stop(process)
            assert process.stdout is not None
            process.stdout.close()
