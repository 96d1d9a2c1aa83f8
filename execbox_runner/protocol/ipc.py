"""The daemon <-> worker channel: msgpack messages in length-prefixed frames.

A worker hosts many executions at once: every frame is ``[slot, message]``,
where the slot (chosen by the daemon in ``Run``) names the execution.

A worker is untrusted (guest code runs in it), so everything it sends is
typed here and checked again by the session before it can reach a host.
JSON values travel as UTF-8 JSON text (``bytes``) so the daemon can splice
them into host frames without decoding them.
"""

from __future__ import annotations

import json
import struct
from typing import Final, TypeAlias

import msgspec
from msgspec import Struct

from .messages import ErrorCode

HEADER: Final = struct.Struct(">I")
# What the zygote tells the daemon on its control socket: (kind, worker PID, wait status).
ZYGOTE_REPORT: Final = struct.Struct(">cII")
FORKED: Final = b"F"  # the answer to a fork request: the new worker's PID (status 0)
EXITED: Final = b"X"  # a worker the zygote reaped, with its ``waitpid`` status
CPU_LIMIT: Final = b"C"  # as EXITED, for a worker the kernel killed at its CPU-time limit (RLIMIT_CPU)


class Run(Struct, array_like=True, tag=0):
    """Start one execution on a fresh QuickJS runtime."""

    code: str
    budget_s: float  # wall-clock seconds left of timeoutMs when the run is sent
    memory_limit: int
    max_log_lines: int
    max_log_chars: int
    providers: list[tuple[str, list[str]]]  # (namespace, [safeName, ...])
    max_output_bytes: int  # largest result, or tool inputs of one message, in JSON bytes


class Settle(Struct, array_like=True, tag=1):
    """A tool result: resolve (``value`` is JSON text, None for undefined) or reject (``code``,
    and ``message`` as JSON text: a host's message may hold lone surrogates, as JavaScript strings
    do, and msgpack strings cannot; see ``reject``)."""

    call_id: int
    ok: bool
    value: bytes | None = None
    code: str = ""
    message: str = '""'

    @classmethod
    def reject(cls, call_id: int, code: str, message: str) -> Settle:
        return cls(call_id=call_id, ok=False, code=code, message=json.dumps(message))


class Abort(Struct, array_like=True, tag=2):
    """Stop the current execution now: reject pending tools and unwind."""


class Evict(Struct, array_like=True, tag=3):
    """End the execution now with ``memory_limit``: the daemon's memory budget is spent and it
    holds the largest heap."""


class Measure(Struct, array_like=True, tag=4):
    """(Slot 0) Report the heap of every execution this worker hosts (``Heaps``)."""


class ToolCalls(Struct, array_like=True, tag=10):
    """Tool calls the guest made (``(call_id, provider, tool, input JSON or None)``)
    and log lines written since the last message."""

    calls: list[tuple[int, str, str, bytes | None]]
    logs: list[str]


class Finished(Struct, array_like=True, tag=11):
    """The execution ended."""

    ok: bool
    result: bytes | None
    code: ErrorCode | None
    message: str
    logs: list[str]


class Heaps(Struct, array_like=True, tag=14):
    """(Slot 0) The answer to ``Measure``: each hosted execution's slot and the bytes its QuickJS
    runtime holds."""

    sizes: list[tuple[int, int]]


class Ready(Struct, array_like=True, tag=12):
    """The worker is initialised and waiting for a ``Run``."""


class Probed(Struct, array_like=True, tag=13):
    """Test hook only (``worker --probe``): what the confined worker could still do."""

    outcomes: dict[str, str]
    missing: list[str]


ToWorker: TypeAlias = Run | Settle | Abort | Evict | Measure
FromWorker: TypeAlias = ToolCalls | Finished | Ready | Probed | Heaps

_encoder: Final = msgspec.msgpack.Encoder()
to_worker_decoder: Final = msgspec.msgpack.Decoder(tuple[int, ToWorker])
from_worker_decoder: Final = msgspec.msgpack.Decoder(tuple[int, FromWorker])


def frame(slot: int, message: ToWorker | FromWorker) -> bytes:
    """One frame: the execution's slot and the message, length-prefixed."""
    body = _encoder.encode((slot, message))
    return HEADER.pack(len(body)) + body
