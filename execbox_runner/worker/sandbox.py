"""Confining a worker process before any guest code runs.

Guest code runs in QuickJS, which has no host capabilities. This module is for
the case where an engine bug is exploited anyway: the process that runs guest
code can then still not read host files, reach the network, start processes
or write files, because the kernel refuses.

``confine`` applies, in order (each step needs the ones before it):

1. a new, empty network namespace (no interfaces up: nothing is reachable); when the
   daemon's user may not create one (not root), inside a new user namespace, where the
   kernel allows an unprivileged one, with every capability it grants dropped again;
2. dropping to an unprivileged user (``nobody``) when running as root;
3. closing every inherited file descriptor except the worker's channel (and the timer its
   runners share, ``alarm.py``);
4. resource limits: an address-space backstop above the QuickJS memory
   limit, a CPU-time backstop (hard as well as soft), no core files, no file
   writes (size 0), a small open-file limit, no new processes;
5. W^X: no mapping left both writable and executable;
6. ``no_new_privs``;
7. a seccomp filter (``seccomp.py``) that allows only what running QuickJS
   and talking on the channel needs: memory (never executable), time,
   futexes, its own timer, signals masks, reads/writes, reading its limits,
   randomness, exit. Everything else (open, socket, connect, exec, fork, clone,
   ptrace, kill, changing a limit, mapping code, ...) fails with EPERM. It is
   installed with TSYNC, so it covers all the worker's threads.

``capabilities()`` tells, without changing anything, which of these this host
can enforce, so the daemon can warn about the rest and report them, and
``network_mechanism()`` how the network namespace is made.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import os
import resource
import socket
import struct
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, cast

from . import prefault, seccomp
from .libc import libc as _libc

NOBODY: Final = 65534
CLONE_NEWNET: Final = 0x40000000
CLONE_NEWUSER: Final = 0x10000000
PR_CAPBSET_DROP: Final = 24
LINUX_CAPABILITY_VERSION_3: Final = 0x20080522
PROT_READ: Final = 1
PROT_WRITE: Final = 2
PROT_EXEC: Final = 4
MAP_PRIVATE_ANONYMOUS: Final = 0x22
# PROCMAP_QUERY (Linux 6.11): ask /proc/PID/maps for the mappings with given permissions, without
# the kernel formatting every line of the file (paths included). ``_IOWR('f', 17, struct
# procmap_query)``; the struct's fields, all in, out or both: size, query_flags, query_addr,
# vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode, dev_major, dev_minor,
# vma_name_size, build_id_size, vma_name_addr, build_id_addr.
PROCMAP_QUERY: Final = 0xC0686611
_PROCMAP_QUERY_STRUCT: Final = struct.Struct("=9Q4I2Q")
PROCMAP_QUERY_VMA_WRITABLE: Final = 0x02
PROCMAP_QUERY_VMA_EXECUTABLE: Final = 0x04
PROCMAP_QUERY_COVERING_OR_NEXT_VMA: Final = 0x10

# How workers are kept off the network: a network namespace made with CAP_SYS_ADMIN (root);
# one made inside a new user namespace (no privileges needed where the kernel allows it); none.
NETWORK_MECHANISMS: Final = ("netns", "userns+netns", "none")
ISOLATION_FAILED: Final = 71  # EX_OSERR: a worker's exit status when it cannot make its namespace


@dataclass(frozen=True)
class Capabilities:
    """Which protections this host can enforce for workers."""

    seccomp: bool
    network_namespace: bool
    drop_privileges: bool
    running_as_root: bool
    rlimits: bool
    network_mechanism: str  # one of NETWORK_MECHANISMS


@dataclass(frozen=True)
class Limits:
    """Process limits for one worker."""

    address_space_bytes: int
    cpu_seconds: int
    open_files: int = 16


def capabilities() -> Capabilities:
    """Probe, in a throwaway child process, which protections work here."""
    root = os.geteuid() == 0
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child tries each step for real, as a worker would, and reports a bit mask
        os.close(read_end)
        missing = isolate()
        bits = (0 if "network_namespace" in missing else 1) | (2 if root and "drop_privileges" not in missing else 0)
        bits |= 16 if _network == "userns+netns" else 0
        try:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            bits |= 4
            if seccomp.supported():
                seccomp.install()
                bits |= 8
        except OSError:
            pass
        os.write(write_end, bytes([bits]))
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        data = reader.read(1)
    os.waitpid(pid, 0)
    bits = data[0] if data else 0
    return Capabilities(
        seccomp=bool(bits & 8),
        network_namespace=bool(bits & 1),
        drop_privileges=bool(bits & 2),
        running_as_root=root,
        rlimits=bool(bits & 4),
        network_mechanism="none" if not bits & 1 else "userns+netns" if bits & 16 else "netns",
    )


def network_mechanism(enabled: bool, found: Capabilities | None = None) -> str:
    """How workers get their network namespace on this host with the sandbox ``enabled`` or not:
    one of ``NETWORK_MECHANISMS``, learnt by ``capabilities()``'s probe (this process never
    unshares), or from ``found``, a probe already made."""
    return (found or capabilities()).network_mechanism if enabled else "none"


def close_inherited_fds(*keep: int) -> None:
    """Close every file descriptor but those in ``keep``."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    top = limit if 0 < limit < 1 << 20 else 4096
    low = 0
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, top)


def set_cpu_backstop(seconds: float) -> None:
    """Kill the process after ``seconds`` more CPU time. Soft and hard limit alike: the kernel
    refuses to raise a hard limit without privileges, and seccomp refuses every limit change."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    limit = int(used.ru_utime + used.ru_stime) + max(1, int(seconds) + 1)
    inherited = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if inherited != resource.RLIM_INFINITY:
        limit = min(limit, inherited)
    resource.setrlimit(resource.RLIMIT_CPU, (limit, limit))


def seal_executable_mappings() -> None:
    """Make every mapping that is both writable and executable read-and-execute (W^X).

    The page of ctypes callbacks (``memory_limit.py``'s allocator hooks, made at import,
    before the fork) is one: code written there could run. Nothing writes it again
    after start-up (no callback is made or freed later), and seccomp refuses
    PROT_EXEC from now on, so the process's code is fixed.

    The kernel is asked for just those mappings (``PROCMAP_QUERY``) where it can answer; else
    every line of ``/proc/self/maps`` is read, which costs the kernel far more (it formats each
    mapping's path).
    """
    with open("/proc/self/maps") as maps:
        spans = _writable_executable(maps.fileno())
        if spans is None:
            spans = []
            for line in maps:
                span, permissions = line.split()[:2]
                if "w" in permissions and "x" in permissions:
                    start, end = (int(address, 16) for address in span.split("-"))
                    spans.append((start, end))
    for start, end in spans:
        _protect(start, end - start, PROT_READ | PROT_EXEC)


def _writable_executable(maps: int) -> list[tuple[int, int]] | None:
    """The start and end of each mapping both writable and executable, asked of ``maps`` (an open
    ``/proc/self/maps``) with ``PROCMAP_QUERY``; None where the kernel does not know it."""
    query = _PROCMAP_QUERY_STRUCT
    flags = PROCMAP_QUERY_VMA_WRITABLE | PROCMAP_QUERY_VMA_EXECUTABLE | PROCMAP_QUERY_COVERING_OR_NEXT_VMA
    spans: list[tuple[int, int]] = []
    address = 0
    while True:
        buffer = bytearray(query.pack(query.size, flags, address, *[0] * 12))
        try:
            fcntl.ioctl(maps, PROCMAP_QUERY, buffer)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                return spans  # no mapping at or above ``address`` has both permissions
            if exc.errno in (errno.ENOTTY, errno.EINVAL, errno.EOPNOTSUPP) and not spans:
                return None  # a kernel without the query (before 6.11)
            raise
        start, end = query.unpack_from(buffer)[3:5]
        spans.append((start, end))
        address = end


_isolated: list[str] | None = None  # once isolate() ran in this process: what it could not apply
_network = "none"  # how isolate() kept this process off the network: one of NETWORK_MECHANISMS


def isolate() -> list[str]:
    """Steps 1 and 2, which every worker can share: done once by the zygote, inherited by its children.

    One empty network namespace for all workers isolates as well as one each
    (they cannot open sockets at all), and spares the kernel a namespace set-up
    and tear-down per worker. Returns what could not be applied to this process.

    Without root the namespace is made inside a user namespace, which the kernel
    gives only to a single-threaded process. A process with threads (the zygote:
    the quickjs package starts one at import) stays outside, and every child it
    forks from now on, single-threaded at that moment, makes its own (about 1 ms
    more per fork) or exits: a throwaway child proves first that this works.
    """
    global _isolated, _network
    missing: list[str] = []
    root = os.geteuid() == 0
    if _libc().unshare(CLONE_NEWNET) == 0:
        _network = "netns"
    elif ctypes.get_errno() == errno.EPERM and not root:
        refused = _unshare_user_and_network()
        if refused == 0:
            _network = "userns+netns"
        elif refused == errno.EINVAL and _succeeds_in_child(lambda: _unshare_user_and_network() == 0):
            os.register_at_fork(after_in_child=_isolate_child)
    if _network == "none":
        missing.append("network_namespace")
    if root:
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        except OSError:
            missing.append("drop_privileges")
    _isolated = missing
    if seccomp.supported():  # what confine needs, made here once: each child inherits it made
        seccomp.prepare()
    _mprotect()
    return missing


def _isolate_child() -> None:
    """In a child just forked by a process with threads: the user and network namespace its parent
    could not enter. A child that cannot make one exits rather than run guest code without it."""
    global _network
    try:
        refused = _unshare_user_and_network()
    except OSError:  # capset: the namespace's capabilities would be kept
        refused = -1
    if refused != 0:
        os.write(2, b"execbox worker: cannot make its user and network namespace; exiting\n")
        os._exit(ISOLATION_FAILED)
    _network = "userns+netns"
    if _isolated is not None and "network_namespace" in _isolated:
        _isolated.remove("network_namespace")


def _succeeds_in_child(action: Callable[[], bool]) -> bool:
    """Whether ``action`` returns true in a throwaway child process."""
    pid = os.fork()
    if pid == 0:
        succeeded = False
        try:
            succeeded = action()
        finally:
            os._exit(0 if succeeded else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _unshare_user_and_network() -> int:
    """A network namespace without CAP_SYS_ADMIN: made inside a new user namespace, where the
    kernel (and the container runtime's seccomp profile, and LSMs) allow an unprivileged one.
    0, or the errno of the refusal.

    The user namespace maps this process's uid and gid to themselves, so files and its own
    identity look unchanged; then every capability it grants (all of them, in that namespace)
    is dropped, bounding set included: the process and its workers keep no more power than
    they had outside, whether seccomp is there to refuse the system calls that use them or not.
    Root does not come here: it makes the namespace directly, then drops to ``nobody``.
    """
    uid, gid = os.geteuid(), os.getegid()
    libc = _libc()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return ctypes.get_errno()
    # An LSM may refuse the maps (Ubuntu's AppArmor restriction denies the namespace its
    # capabilities): the network namespace holds all the same, only ids show as the overflow id.
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            _write_once(f"/proc/self/{name}", line)
        except OSError:
            break
    capability = 0
    while libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) == 0:  # until EINVAL, past the last one
        capability += 1
    _clear_capabilities()
    return 0


def _write_once(path: str, text: str) -> None:
    """``text`` in one write(2), as /proc's id maps require."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _clear_capabilities() -> None:
    """Empty the effective, permitted and inheritable sets (capset(2); lowering is always allowed)."""
    header = struct.pack("Ii", LINUX_CAPABILITY_VERSION_3, 0)  # version, this process
    data = bytes(24)  # two {effective, permitted, inheritable} triples of 32 bits, all zero
    if _libc().capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def confine(keep: Iterable[int], limits: Limits) -> list[str]:
    """Confine this process (see the module docstring), its file descriptors but ``keep`` (the
    channel's, the alarm's) closed. Returns what could not be applied."""
    missing = list(_isolated) if _isolated is not None else isolate()
    close_inherited_fds(*keep)
    for name, value in (
        ("RLIMIT_CORE", 0),
        ("RLIMIT_FSIZE", 0),
        ("RLIMIT_NOFILE", limits.open_files),
        ("RLIMIT_AS", limits.address_space_bytes),
    ):
        _limit(name, value)
    set_cpu_backstop(limits.cpu_seconds)
    if os.geteuid() != 0:
        _limit("RLIMIT_NPROC", 0)
    seal_executable_mappings()
    if seccomp.supported():
        seccomp.install()
    else:
        missing.append("seccomp")
    return missing


def _limit(name: str, value: int) -> None:
    """Set resource limit ``name`` (soft and hard) to ``value``; a refusal says which, and the
    hard limit in the way (the daemon logs it as why the worker could not start)."""
    kind = getattr(resource, name)
    try:
        resource.setrlimit(kind, (value, value))
    except (ValueError, OSError) as exc:
        raise OSError(f"cannot set {name} to {value} (hard limit {resource.getrlimit(kind)[1]}): {exc}") from None


def probe() -> dict[str, str]:
    """What a confined process can still do: each attempt's outcome (a test hook).

    Run by ``python -m execbox_runner.worker.loop FD --probe`` after confinement, the
    way guest code would get there through an engine exploit.
    """

    def attempt(action: Callable[[], object]) -> str:
        try:
            action()
        except OSError as exc:
            return f"blocked: {errno.errorcode.get(exc.errno or 0, exc.errno)}"
        except ValueError as exc:  # refused before the kernel was asked (e.g. raising a hard limit)
            return f"blocked: {exc}"
        return "allowed"

    def limit(kind: int) -> str:
        return str(resource.getrlimit(kind)[0])

    cpu = resource.getrlimit(resource.RLIMIT_CPU)
    code = ctypes.cast(_libc().getpid, ctypes.c_void_p).value or 0  # a page of libc's machine code

    return {
        "read_file": attempt(lambda: open("/etc/hostname").read()),
        "write_file": attempt(lambda: open("/tmp/execbox-probe", "w").write("x")),  # noqa: S108 - the probe checks that writing is refused
        "list_directory": attempt(lambda: os.listdir("/")),
        "socket": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
        "unix_socket": attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)),
        "fork": attempt(lambda: os.fork() == 0 and os._exit(0)),
        "exec": attempt(lambda: os.execv("/bin/true", ["true"])),  # noqa: S606 - the probe checks that exec is refused
        "subprocess": attempt(lambda: subprocess.run(["/bin/true"], check=False)),
        "signal_init": attempt(lambda: os.kill(1, 0)),
        "ptrace_init": attempt(lambda: _ptrace_attach(1)),
        # What a capability held in a user namespace would allow: none is held, and seccomp refuses both.
        "unshare": attempt(lambda: _check(_libc().unshare(CLONE_NEWUSER | CLONE_NEWNET), "unshare")),
        # No such filesystem: with the privilege this fails ENODEV (nothing mounted), without it EPERM.
        "mount": attempt(lambda: _check(_libc().mount(b"none", b"/tmp", b"execbox-probe", 0, None), "mount")),
        "raise_nofile": attempt(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))),
        "raise_cpu": attempt(lambda: resource.setrlimit(resource.RLIMIT_CPU, (cpu[1] + 3600, cpu[1] + 3600))),
        "lower_cpu": attempt(lambda: resource.setrlimit(resource.RLIMIT_CPU, (cpu[0] - 1, cpu[1] - 1))),
        "map_executable": attempt(lambda: _map(PROT_READ | PROT_WRITE | PROT_EXEC)),
        "protect_executable": attempt(lambda: _protect(_map(PROT_READ | PROT_WRITE), 4096, PROT_READ | PROT_EXEC)),
        "write_code": attempt(lambda: _protect(code & ~4095, 4096, PROT_READ | PROT_WRITE | PROT_EXEC)),
        # What the worker's prefault thread does (``prefault.py``): it must stay allowed.
        "populate_memory": attempt(lambda: prefault.populate(_map(PROT_READ | PROT_WRITE), 4096)),
        "rlimit_as": limit(resource.RLIMIT_AS),
        "rlimit_nofile": limit(resource.RLIMIT_NOFILE),
        "rlimit_fsize": limit(resource.RLIMIT_FSIZE),
        "rlimit_core": limit(resource.RLIMIT_CORE),
        "rlimit_cpu": limit(resource.RLIMIT_CPU),
        "rlimit_cpu_hard": str(cpu[1]),
        "uid": str(os.getuid()),
        "network": _network,
    }


def _map(protection: int) -> int:
    """A fresh anonymous page with ``protection``: its address."""
    libc = _libc()
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    address = libc.mmap(None, 4096, protection, MAP_PRIVATE_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    return int(address)


@functools.cache
def _mprotect() -> Callable[[int, int, int], int]:
    """libc's mprotect with its argument types set (by the zygote before it forks: see ``isolate``)."""
    mprotect = _libc().mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return cast(Callable[[int, int, int], int], mprotect)


def _protect(start: int, length: int, protection: int) -> None:
    if _mprotect()(start, length, protection) != 0:
        raise OSError(ctypes.get_errno(), "mprotect")


def _ptrace_attach(pid: int) -> None:
    _check(_libc().ptrace(16, pid, None, None), "ptrace")  # PTRACE_ATTACH


def _check(result: int, call: str) -> None:
    """Raise the errno of a libc ``call`` that returned ``result``, unless it succeeded (0)."""
    if result != 0:
        raise OSError(ctypes.get_errno(), call)


def enforcement(enabled: bool, found: Capabilities | None = None) -> dict[str, dict[str, bool]]:
    """Each protection: whether the settings ask for it, and whether this host enforces it
    (``found``: a probe already made, else one is made now)."""
    found = found or capabilities()
    possible = {
        "seccomp": found.seccomp,
        "no_new_privs": found.seccomp,  # set on the way to the filter
        "network_namespace": found.network_namespace,
        "drop_privileges": found.drop_privileges,
        "rlimits": found.rlimits,
        "close_inherited_fds": True,
    }
    requested = {name: enabled and (name != "drop_privileges" or found.running_as_root) for name in possible}
    return {name: {"requested": requested[name], "enforced": requested[name] and possible[name]} for name in possible}


def warnings(report: dict[str, dict[str, bool]]) -> list[str]:
    """One sentence for each protection asked for but not enforceable here."""
    return [
        f"worker protection '{name}' was requested but cannot be enforced on this host"
        for name, state in report.items()
        if state["requested"] and not state["enforced"]
    ]
