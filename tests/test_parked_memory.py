"""What a parked execution costs a worker, and that a worker gives memory back when executions end
(issue 9: memory per parked execution)."""

from __future__ import annotations

import pytest
import quickjs

from execbox_runner.protocol import ipc
from execbox_runner.worker import native
from execbox_runner.worker.guest import GuestRun, fresh_runtime

from .guestkit import run, run_message, value

PARKED = "const r = await tools.slow({}); r + 1"
SLOW = [("tools", ["slow"])]
KIB = 1 << 10
MIB = 1 << 20


def parked(code: str = PARKED) -> GuestRun:
    """A guest awaiting its tool call, id 1."""
    guest = GuestRun(run_message(code, providers=SLOW, budget=60))
    out = guest.start()
    assert isinstance(out, ipc.ToolCalls) and [call[0] for call in out.calls] == [1]
    return guest


def test_the_bootstrap_keeps_no_source_text_and_the_guests_own_functions_keep_theirs() -> None:
    code = "[String(console.log), String(tools.echo), String(queueMicrotask), String(function f() { return 1 })]"
    log, tool, microtask, own = value(run(code))
    for text in (log, tool, microtask):
        assert text.endswith("() {\n    [native code]\n}"), text
    assert own == "function f() { return 1 }"


@pytest.mark.skipif(not native.SUPPORTED, reason="the bootstrap is compiled only where the native layout holds")
def test_the_bootstrap_adds_little_to_a_fresh_runtime() -> None:
    """A guard on bootstrap.js: what it adds to every runtime's heap, beside QuickJS's own context.

    QuickJS counts ~97 KiB for a bare context (in ~164 KiB of its 4 KiB arenas); the bootstrap
    added ~52 KiB before its source text was dropped and its error recorders shared one handler.
    """
    bare = quickjs.Context().memory()["malloc_size"]
    prepared = fresh_runtime().context.memory()["malloc_size"]
    assert prepared - bare <= 48 * KIB, (prepared - bare) / KIB
