"""The worker's prefault thread: the heap's new pages are resident before anything touches them.

Each case runs in a process of its own, as a worker does (one malloc arena):
``M_TOP_PAD`` and the thread are process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from execbox_runner.worker.prefault import PAD_BYTES

# Grows the heap by 1 MiB of 64 KiB blocks that nothing writes (malloc touches one page of
# each), then reports how much the resident memory grew within 5 s of ``check``.
GROW = """
import ctypes, json, os, sys, time
from execbox_runner.worker import prefault
page = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * page
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
faulter = prefault.Prefaulter() if sys.argv[1] == "thread" else None
before = rss()
blocks = [libc.malloc(64 << 10) for _ in range(16)]
if faulter is not None:
    faulter.check()
deadline = time.monotonic() + 5.0
while rss() - before < prefault.PAD_BYTES and time.monotonic() < deadline:
    time.sleep(0.01)
print(json.dumps({"grown": rss() - before}))
"""


def _grown(mode: str) -> int:
    completed = subprocess.run(
        [sys.executable, "-c", GROW, mode],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MALLOC_ARENA_MAX": "1"},
        check=True,
    )
    return int(json.loads(completed.stdout)["grown"])


def test_the_heap_grown_is_resident_at_once_with_the_thread() -> None:
    # 1 MiB asked for, extended by PAD_BYTES: all of it faulted in by the thread, untouched.
    assert _grown("thread") >= PAD_BYTES


def test_without_the_thread_only_what_is_touched_is_resident() -> None:
    # The control: the same growth leaves the untouched pages out of the resident set.
    assert _grown("none") < 2 << 20
