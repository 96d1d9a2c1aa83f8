"""A worker taken over through an engine bug: what it can still do, from inside the real confined
workers of a real daemon, in both profiles.

A ``sitecustomize`` module, loaded by the zygote, stands for the exploit: a guest whose result is
``EXPLOIT:`` and Python source has that source run in its worker, confined, on the thread that ran
the guest, and gets back what the source left in ``result``. Python with ctypes makes any system
call native code could; the source can load no module, as an exploit could open no file.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import signal
import ssl
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from execbox_runner.worker import seccomp

from .daemonkit import Daemon, certificate, children_of, client, run_to_done, running_daemon_with_site

COMPROMISED_WORKER = textwrap.dedent(
    """
    import os

    if os.environ.get("EXECBOX_TEST_COMPROMISED_WORKER"):
        import ctypes, errno, json, sys
        from execbox_runner.protocol import ipc
        from execbox_runner.worker import loop

        _send = loop.Worker._send

        def send(self, slot, message, **options):
            if isinstance(message, ipc.Finished) and (message.result or b"").startswith(b'"EXPLOIT:'):
                scope = {}
                exec(json.loads(message.result).removeprefix("EXPLOIT:"), scope)
                message = ipc.Finished(True, json.dumps(scope["result"]).encode(), None, "", [])
            _send(self, slot, message, **options)

        loop.Worker._send = send
    """
)

# Each secret the daemon is given: by its environment, its tokens file, its configuration file.
TENANT_A, TENANT_B, METRICS, CLOUD = "tenant-a-secret-1", "tenant-b-secret-2", "metrics-secret-3", "cloud-secret-4"

# The exploit's tools: ``call(number, *arguments)``, a raw system call's errno name or "allowed".
PRELUDE = """
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buffer = ctypes.create_string_buffer(4096)

def call(number, *arguments):
    values = [ctypes.c_long(a) if isinstance(a, int) else a for a in arguments]
    return "allowed" if libc.syscall(ctypes.c_long(number), *values) >= 0 else errno.errorcode[ctypes.get_errno()]
"""

# What the daemon's secrets would be found in: the environment, and the environment's strings as
# the kernel copied them onto the stack, just below the program's name (AT_EXECFN).
READ_SECRETS = """
libc.getauxval.restype = ctypes.c_ulong
name = libc.getauxval(31)
strings = [s.decode("latin-1") for s in ctypes.string_at(name - 65536, 65536).split(b"\\0") if s]
result = {"environ": dict(os.environ), "stack": strings}
"""

# Every system call below must fail with EPERM: by number and arguments, in the context of
# ``TARGETS`` (the daemon's PID, its zygote's, a neighbouring worker's, the daemon's files).
SYSTEM_CALLS = {
    **{
        f"open {what}": f"call(257, -100, targets[{what!r}].encode(), 0)"
        for what in ("config", "tokens file", "TLS key", "daemon environ", "daemon mem", "zygote environ")
    },
    "open neighbour mem": "call(257, -100, f'/proc/{neighbour}/mem'.encode(), 2)",
    "open /etc/passwd": "call(2, b'/etc/passwd', 0)",
    "openat2": "call(437, -100, b'/etc/passwd', buffer, 24)",
    "open_by_handle_at": "call(304, -100, buffer, 0)",
    "stat": "call(4, b'/etc/passwd', buffer)",
    "newfstatat": "call(262, -100, b'/etc/passwd', buffer, 0)",
    "readlink": "call(89, b'/proc/self/exe', buffer, 256)",
    "getdents64": "call(217, 3, buffer, 4096)",
    "creat": "call(85, b'/tmp/execbox-confinement', 0o600)",
    "socket tcp": "call(41, 2, 1, 0)",
    "socket udp": "call(41, 2, 2, 0)",
    "socket tcp6": "call(41, 10, 1, 0)",
    "socket unix": "call(41, 1, 1, 0)",
    "socket netlink": "call(41, 16, 3, 0)",
    "socket packet": "call(41, 17, 3, 0)",
    "socketpair": "call(53, 1, 1, 0, buffer)",
    "connect": "call(42, 3, buffer, 16)",
    "sendmsg, passing descriptors": "call(46, 3, buffer, 0)",
    "recvmsg": "call(47, 3, buffer, 0)",
    "kill daemon": "call(62, daemon, 9)",
    "kill neighbour": "call(62, neighbour, 9)",
    "kill everyone": "call(62, -1, 9)",
    "kill zygote": "call(62, zygote, 9)",
    "tkill": "call(200, daemon, 9)",
    "tgkill": "call(234, daemon, daemon, 9)",
    "rt_sigqueueinfo": "call(129, neighbour, 9, buffer)",
    "pidfd_open": "call(434, neighbour, 0)",
    "pidfd_send_signal": "call(424, 3, 9, 0, 0)",
    "ptrace attach": "call(101, 16, neighbour, 0, 0)",
    "ptrace traceme": "call(101, 0, 0, 0, 0)",
    "process_vm_readv": "call(310, neighbour, buffer, 1, buffer, 1, 0)",
    "process_vm_writev": "call(311, neighbour, buffer, 1, buffer, 1, 0)",
    "kcmp": "call(312, neighbour, os.getpid(), 0, 0, 0)",
    "clock_gettime, the daemon's CPU time": "call(228, (~daemon << 3) | 2, buffer)",
    "clock_getres, whether a process exists": "call(229, (~neighbour << 3) | 2, buffer)",
    "clock_nanosleep, on a neighbour's CPU time": "call(230, (~neighbour << 3) | 2, 0, buffer, 0)",
    "fork": "call(57)",
    "clone": "call(56, 0x10000000, 0, 0, 0, 0)",
    "clone3": "call(435, buffer, 88)",
    "unshare": "call(272, 0x10000000 | 0x40000000)",
    "setns": "call(308, 3, 0)",
    "mount": "call(165, b'none', b'/tmp', b'tmpfs', 0, 0)",
    "chroot": "call(161, b'/')",
    "pivot_root": "call(155, b'/', b'/')",
    "execve": "call(59, b'/bin/true', 0, 0)",
    "execveat": "call(322, -100, b'/bin/true', 0, 0, 0)",
    "memfd_create": "call(319, b'payload', 0)",
    "io_uring_setup": "call(425, 8, buffer)",
    "bpf": "call(321, 0, buffer, 72)",
    "userfaultfd": "call(323, 0)",
    "perf_event_open": "call(298, buffer, 0, -1, -1, 0)",
    "keyctl": "call(250, 0, -3, 0)",
    "add_key": "call(248, b'user', b'key', b'value', 5, -2)",
    "request_key": "call(249, b'user', b'key', 0, 0)",
    "personality": "call(135, 0x0400000)",
    "prctl dumpable": "call(157, 4, 1, 0, 0, 0)",
    "prctl seccomp": "call(157, 22, 0, 0, 0, 0)",
    "seccomp": "call(317, 1, 0, buffer)",
    "mmap executable": "call(9, 0, 4096, 7, 0x22, -1, 0)",
    "mprotect executable": "call(10, ctypes.addressof(buffer) & ~4095, 4096, 7)",
    "pkey_mprotect executable": "call(329, ctypes.addressof(buffer) & ~4095, 4096, 7, -1)",
    "setrlimit": "call(160, 7, buffer)",
    "prlimit64 a limit": "call(302, 0, 7, buffer, 0)",
    "prlimit64 another process": "call(302, neighbour, 7, 0, buffer)",
    "setuid": "call(105, 0)",
    "capset": "call(126, buffer, buffer)",
    "dup": "call(32, 3)",
    "fcntl": "call(72, 3, 1)",
    "ioctl": "call(16, 3, 0x5421, buffer)",
    "shmget": "call(29, 0, 4096, 0o1666)",
    "msgget": "call(68, 0, 0o1666)",
    "sched_setaffinity": "call(203, 0, 8, buffer)",
    "setpriority": "call(141, 0, 0, -20)",
    "modify_ldt": "call(154, 1, buffer, 16)",
    "iopl": "call(172, 3)",
    "syslog": "call(103, 3, buffer, 16)",
}
ATTEMPT = "result = {" + ", ".join(f"{name!r}: {source}" for name, source in SYSTEM_CALLS.items()) + "}"

# The descriptors open in the worker, by number (fstat, by its number, succeeds), and its limits.
DESCRIPTORS_AND_LIMITS = """
import resource
open_fds = [fd for fd in range(4096) if call(5, fd, buffer) == "allowed"]
limits = {name: resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")}
result = {"fds": open_fds, "limits": limits}
"""


@dataclass
class Compromised:
    daemon: Daemon
    trusted: ssl.SSLContext
    targets: dict[str, Any]

    def exploit(self, source: str, token: str = TENANT_A) -> Any:
        """What ``source`` leaves in ``result``, run in a worker of ``token``'s tenant."""
        headers = {"Authorization": f"Bearer {token}"}
        with client(self.daemon.url, additional_headers=headers, ssl=self.trusted) as ws:
            done = run_to_done(ws, "exploit", json.dumps("EXPLOIT:" + PRELUDE + source))
        assert done["ok"], done
        return done["result"]

    def in_context(self, source: str) -> str:
        """``source`` with ``targets``, ``daemon``, ``zygote`` and ``neighbour`` (another of the
        daemon's workers) defined."""
        return (
            f"targets = {json.dumps(self.targets)}\n"
            "daemon, zygote = targets['daemon'], targets['zygote']\n"
            "neighbour = next((pid for pid in targets['workers'] if pid != os.getpid()), zygote)\n"
        ) + source


@pytest.fixture(scope="module", params=["standard", "hardened"])
def compromised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Compromised]:
    directory = tmp_path_factory.mktemp("compromised")
    certfile, keyfile, trusted = certificate(directory)
    tokens = directory / "tokens"
    tokens.write_text(f"{TENANT_B} tenant=b\n")
    config = directory / "runner.toml"
    config.write_text(f'metrics_token = "{METRICS}"\n')
    with running_daemon_with_site(
        directory,
        COMPROMISED_WORKER,
        "EXECBOX_TEST_COMPROMISED_WORKER",
        *("--profile", request.param, "--warm-workers", "2", "--config", str(config)),
        *("--tokens-file", str(tokens), "--certfile", str(certfile), "--keyfile", str(keyfile)),
        env={"EXECBOX_RUNNER_TOKENS": TENANT_A, "CLOUD_API_KEY": CLOUD},
    ) as daemon:
        (zygote,) = children_of(daemon.process.pid)
        pid = daemon.process.pid
        targets = {"daemon": pid, "zygote": zygote, "workers": children_of(zygote), "config": str(config)}
        targets |= {"tokens file": str(tokens), "TLS key": str(keyfile)}
        targets |= {"daemon environ": f"/proc/{pid}/environ", "daemon mem": f"/proc/{pid}/mem"}
        targets["zygote environ"] = f"/proc/{zygote}/environ"
        yield Compromised(daemon, trusted, targets)


def test_a_taken_over_worker_holds_none_of_the_daemons_secrets(compromised: Compromised) -> None:
    """Not in its environment, nor in the strings the kernel copied onto its stack: the daemon
    starts its zygote without its environment's tokens and other variables."""
    found = compromised.exploit(READ_SECRETS)
    assert found["environ"]["PYTHONPATH"] and found["stack"]  # the exploit reads both
    assert "EXECBOX_RUNNER_TOKENS" not in found["environ"] and "CLOUD_API_KEY" not in found["environ"]
    for secret in (TENANT_A, TENANT_B, METRICS, CLOUD):
        assert secret not in json.dumps(found), secret
    # As the kernel keeps it for the zygote, of which each worker is a copy.
    environ = Path(f"/proc/{compromised.targets['zygote']}/environ").read_bytes()
    assert b"PYTHONPATH=" in environ and TENANT_A.encode() not in environ and CLOUD.encode() not in environ


@pytest.fixture(scope="module")
def attempts(compromised: Compromised) -> dict[str, str]:
    """Each of ``SYSTEM_CALLS`` made by one taken-over worker of the profile: its outcome."""
    outcomes: dict[str, str] = compromised.exploit(compromised.in_context(ATTEMPT))
    return outcomes


@pytest.mark.parametrize("attempt", SYSTEM_CALLS)
def test_a_taken_over_worker_is_refused(attempts: dict[str, str], attempt: str) -> None:
    assert attempts[attempt] == "EPERM"


# The clocks a worker reads: by number, and a runner thread's CPU time (by the ID of its clock).
CLOCKS = """
import threading, time
clocks = {name: getattr(time, name) for name in dir(time) if name.startswith("CLOCK_")}
clocks["a runner's CPU time"] = time.pthread_getcpuclockid(threading.get_ident())
result = {name: call(228, clock, buffer) for name, clock in clocks.items()}
"""


def test_a_taken_over_worker_reads_every_clock_but_another_processs(compromised: Compromised) -> None:
    read = compromised.exploit(CLOCKS)
    assert read["CLOCK_MONOTONIC"] == read["CLOCK_THREAD_CPUTIME_ID"] == read["a runner's CPU time"] == "allowed"
    assert set(read.values()) <= {"allowed", "EINVAL"}, read  # EINVAL: a clock this kernel lacks


def test_a_taken_over_worker_has_only_its_channel_and_alarm_and_cannot_lift_its_limits(
    compromised: Compromised,
) -> None:
    found = compromised.exploit(DESCRIPTORS_AND_LIMITS)
    assert len(found["fds"]) == 2, found["fds"]
    limits = found["limits"]
    for name in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE"):
        soft, hard = limits[name]
        assert soft == hard and 0 <= hard < 1 << 40, (name, limits[name])  # a hard limit, never lifted
    assert limits["RLIMIT_FSIZE"] == limits["RLIMIT_CORE"] == [0, 0]


def test_a_taken_over_worker_never_runs_another_tenants_code(compromised: Compromised) -> None:
    """An implant left in a worker by one tenant's exploit is never met by another tenant's."""
    implant = "import builtins; builtins.implant = 'tenant a'; result = os.getpid()"
    look = "import builtins; result = [getattr(builtins, 'implant', None), os.getpid()]"
    planted = {compromised.exploit(implant) for _ in range(3)}
    seen = [compromised.exploit(look, TENANT_B) for _ in range(3)]
    assert all(found is None and pid not in planted for found, pid in seen), (planted, seen)


# Machine code for each other system-call interface: write(fd, buffer, n), the x86-64 ABI's
# arguments (rdi, rsi, rdx) moved to the interface's. The i386 one: push rbx; mov eax, 4;
# mov ebx, edi; mov ecx, esi; int 0x80; pop rbx; ret. The x32 one: mov eax, 0x40000001; syscall; ret.
OTHER_INTERFACES = {
    "i386": bytes.fromhex("53b80400000089fb89f1cd805bc3"),
    "x32": bytes.fromhex("b8010000400f05c3"),
}


@pytest.mark.parametrize("interface", OTHER_INTERFACES)
def test_a_system_call_through_another_interface_kills_the_worker(interface: str) -> None:
    """The filter refuses a call made through the 32-bit or x32 interface by killing the process
    (SIGSYS), whose numbers are other calls' there. The code is mapped before the filter, which
    would refuse it; a kernel without the 32-bit interface kills the process for it itself."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            page.write(OTHER_INTERFACES[interface])
            code = ctypes.addressof(ctypes.c_char.from_buffer(page))
            write = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long)(code)
            text = ctypes.create_string_buffer(b"made")
            seccomp.install()
            os.write(write_end, str(write(write_end, ctypes.addressof(text), 4)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        written = reader.read()
    _, status = os.waitpid(pid, 0)
    assert written == b""
    killed_by = {"i386": {signal.SIGSYS, signal.SIGSEGV}, "x32": {signal.SIGSYS}}[interface]
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) in killed_by, status
