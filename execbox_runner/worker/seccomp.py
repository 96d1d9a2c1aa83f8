"""The worker's seccomp filter: the system calls a confined worker may still make.

A raw BPF program for x86-64 (``sandbox.confine`` installs it last, with TSYNC, so that it covers
every thread of the worker): the calls in ``ALLOWED_SYSCALLS``; ``mmap`` and ``mprotect`` without
``PROT_EXEC``; ``prlimit64`` only to read this process's own limits; the clock calls on any clock
but another process's CPU-time clock. Any other call fails with ``EPERM``; a call through another
system-call interface (32-bit, x32) kills the process. The program and the call that installs it
are made once, by the zygote before it forks.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os
import platform
import struct
from collections.abc import Callable, Iterable
from typing import Final

from .libc import libc as _libc

PR_SET_NO_NEW_PRIVS: Final = 38
SYS_SECCOMP_X86_64: Final = 317
SECCOMP_SET_MODE_FILTER: Final = 1
SECCOMP_FILTER_FLAG_TSYNC: Final = 1
AUDIT_ARCH_X86_64: Final = 0xC000003E

# BPF opcodes and seccomp return values.
_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_JGE_K: Final = 0x35
_JSET_K: Final = 0x45
_RET_K: Final = 0x06
_RET_ALLOW: Final = 0x7FFF0000
_RET_KILL_PROCESS: Final = 0x80000000
_RET_ERRNO: Final = 0x00050000
_OFFSET_NR: Final = 0
_OFFSET_ARCH: Final = 4
_OFFSET_ARG0_LOW: Final = 16
_OFFSET_ARG2_LOW: Final = 32
_OFFSET_ARG2_HIGH: Final = 36

# What a worker needs once initialised (x86-64 syscall numbers).
ALLOWED_SYSCALLS: Final = {
    "read": 0, "write": 1, "close": 3, "fstat": 5, "poll": 7, "lseek": 8,
    "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15,
    "sched_yield": 24, "mremap": 25, "madvise": 28, "nanosleep": 35, "getpid": 39, "sendto": 44,
    "recvfrom": 45, "exit": 60, "getrlimit": 97, "getrusage": 98, "getuid": 102,
    "getgid": 104, "geteuid": 107, "getegid": 108, "sigaltstack": 131,
    "gettid": 186, "futex": 202, "restart_syscall": 219, "exit_group": 231, "set_robust_list": 273,
    "timerfd_settime": 286, "getrandom": 318, "rseq": 334,
}  # fmt: skip
# Allowed only for some arguments: mmap and mprotect without PROT_EXEC (W^X: QuickJS does
# not JIT, so no new code is ever mapped); prlimit64 only to read this process's limits.
_MMAP: Final = 9
_MPROTECT: Final = 10
_PRLIMIT64: Final = 302
# clock_gettime, clock_getres and clock_nanosleep: on the clocks named by number (CLOCK_MONOTONIC,
# ...) and a thread's CPU-time clock (the runners time each other's steps; the kernel keeps them to
# this process's threads), not on another process's CPU-time clock (negative, without the thread
# bit), which the kernel gives for any PID: every process's CPU time, the daemon's and other
# tenants' workers' included, and which PIDs exist.
_CLOCK_CALLS: Final = (228, 229, 230)
_CLOCK_NEGATIVE: Final = 0x80000000
_CLOCK_PER_THREAD: Final = 4


def _filter(allowed: Iterable[int]) -> bytes:
    """The seccomp BPF program: allow ``allowed``, mmap and mprotect without PROT_EXEC, prlimit64
    reading this process's limits, and the clock calls but on another process's clock; EPERM the
    rest."""
    program: list[tuple[int, int, str, str]] = []  # (code, k, jump if true, if false): labels, "" the next
    labels: dict[str, int] = {}

    def emit(code: int, k: int, true: str = "", false: str = "") -> None:
        program.append((code, k, true, false))

    def label(name: str) -> None:
        labels[name] = len(program)

    emit(_LD_W_ABS, _OFFSET_ARCH)
    emit(_JEQ_K, AUDIT_ARCH_X86_64, false="kill")
    emit(_LD_W_ABS, _OFFSET_NR)
    emit(_JGE_K, 0x40000000, true="kill")  # the x32 ABI: not ours
    for number in sorted(set(allowed)):
        emit(_JEQ_K, number, true="allow")
    emit(_JEQ_K, _MMAP, true="check_prot")
    emit(_JEQ_K, _MPROTECT, true="check_prot")
    for number in _CLOCK_CALLS:
        emit(_JEQ_K, number, true="check_clock")
    emit(_JEQ_K, _PRLIMIT64, false="deny")
    emit(_LD_W_ABS, _OFFSET_ARG0_LOW)
    emit(_JEQ_K, 0, false="deny")  # another process
    emit(_LD_W_ABS, _OFFSET_ARG2_LOW)
    emit(_JEQ_K, 0, false="deny")  # a new limit given
    emit(_LD_W_ABS, _OFFSET_ARG2_HIGH)
    emit(_JEQ_K, 0, true="allow", false="deny")
    label("check_prot")
    emit(_LD_W_ABS, _OFFSET_ARG2_LOW)
    emit(_JSET_K, mmap.PROT_EXEC, true="deny", false="allow")
    label("check_clock")
    emit(_LD_W_ABS, _OFFSET_ARG0_LOW)
    emit(_JSET_K, _CLOCK_NEGATIVE, false="allow")
    emit(_JSET_K, _CLOCK_PER_THREAD, true="allow", false="deny")
    label("deny")
    emit(_RET_K, _RET_ERRNO | errno.EPERM)
    label("allow")
    emit(_RET_K, _RET_ALLOW)
    label("kill")
    emit(_RET_K, _RET_KILL_PROCESS)

    def offset(index: int, target: str) -> int:
        return labels[target] - index - 1 if target else 0

    return b"".join(
        struct.pack("HBBI", code, offset(index, true), offset(index, false), k)
        for index, (code, k, true, false) in enumerate(program)
    )


class _SockFprog(ctypes.Structure):
    """``struct sock_fprog``: a BPF program's length in instructions and its address."""

    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@functools.cache
def prepare() -> tuple[Callable[[], int], ctypes.Array[ctypes.c_char]]:
    """The seccomp(2) call that installs the worker's filter, its arguments made, and the buffer
    holding the program (kept alive with it). Made once, by the zygote before it forks (see
    ``isolate``): the program, a ctypes array type, a structure and a function's argument types
    are made in every child otherwise, on the way to its Ready."""
    program = _filter(ALLOWED_SYSCALLS.values())
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    syscall = _libc().syscall
    syscall.restype = ctypes.c_long
    arguments = (
        ctypes.c_long(SYS_SECCOMP_X86_64),
        ctypes.c_long(SECCOMP_SET_MODE_FILTER),
        ctypes.c_long(SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.pointer(fprog),
    )
    return functools.partial(syscall, *arguments), buffer


def install() -> None:
    """``no_new_privs`` and the worker's seccomp filter, for this process and all its threads."""
    call, _ = prepare()
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if call() != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER)")


@functools.cache
def supported() -> bool:
    return (
        platform.machine() == "x86_64"
        and os.path.exists("/proc/self/status")
        and "Seccomp:" in open("/proc/self/status").read()
    )
