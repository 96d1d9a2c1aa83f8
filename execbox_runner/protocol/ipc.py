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
# What the zygote tells the daemon on its control socket: (kind, worker PID, wait status, and the
# CPU time the worker spent over its life, in microseconds, as the kernel reported it when reaped).
ZYGOTE_REPORT: Final = struct.Struct(">cIIQ")
FORKED: Final = b"F"  # the answer to a fork request: the new worker's PID (status and CPU 0)
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


class Share(Struct, array_like=True, tag=5):
    """(Slot 0) Run at most ``steps`` of this worker's executions at once (0: as many as it has
    runner threads): its tenant's part of a machine shared with other tenants."""

    steps: int


# A tool call the guest made: (call_id, provider, tool, input JSON or None).
Call: TypeAlias = tuple[int, str, str, bytes | None]


class ToolCalls(Struct, array_like=True, tag=10):
    """Tool calls the guest made and log lines written since the last message."""

    calls: list[Call]
    logs: list[str]


class Finished(Struct, array_like=True, tag=11):
    """The execution ended; ``calls``: tool calls the guest made since the last message and never
    awaited (a call it makes and then finishes, fails or times out), sent before the ``done``."""

    ok: bool
    result: bytes | None
    code: ErrorCode | None
    message: str
    logs: list[str]
    calls: list[Call] = []


class Heaps(Struct, array_like=True, tag=14):
    """(Slot 0) The answer to ``Measure``: each hosted execution's slot and the bytes its QuickJS
    runtime holds."""

    sizes: list[tuple[int, int]]


class Ready(Struct, array_like=True, tag=12):
    """The worker is initialised and waiting for a ``Run``."""


class StartFailed(Struct, array_like=True, tag=15):
    """The worker could not start (instead of ``Ready``; it exits next): why, for the daemon's log."""

    reason: str


class Probed(Struct, array_like=True, tag=13):
    """Test hook only (``worker --probe``): what the confined worker could still do."""

    outcomes: dict[str, str]
    missing: list[str]


ToWorker: TypeAlias = Run | Settle | Abort | Evict | Measure | Share
FromWorker: TypeAlias = ToolCalls | Finished | Ready | StartFailed | Probed | Heaps

_encoder: Final = msgspec.msgpack.Encoder()
to_worker_decoder: Final = msgspec.msgpack.Decoder(tuple[int, ToWorker])
from_worker_decoder: Final = msgspec.msgpack.Decoder(tuple[int, FromWorker])


def max_frame(max_output_bytes: int) -> int:
    """The largest frame a worker sends, given ``--max-output-bytes``: the daemon loses a worker that
    sends a larger one. The largest is a ``Finished`` with a result and the tool inputs of its last
    report, each of up to ``max_output_bytes``, and, where no ring carries them as they are written,
    the step's log lines: up to a sixth of it in characters, with their lengths at most four bytes for
    each (two thirds of it). The error message (``guest.MAX_MESSAGE_CHARS``) fits the MiB left."""
    return 3 * max_output_bytes + (1 << 20)


def frame(slot: int, message: ToWorker | FromWorker) -> bytes:
    """One frame: the execution's slot and the message, length-prefixed."""
    body = _encoder.encode((slot, message))
    return HEADER.pack(len(body)) + body


class FrameTooLarge(Exception):
    """A frame's header announced a body over the reader's bound."""

    def __init__(self, length: int) -> None:
        super().__init__(f"frame of {length} bytes")
        self.length = length


class Unframer:
    """Frame bodies out of the channel's bytes as they arrive, at either end (no I/O here).

    ``max_body`` bounds what a header may announce (the daemon's bound on untrusted workers),
    checked as soon as the header is in, before any of the body is kept.
    """

    def __init__(self, max_body: int | None = None) -> None:
        self._buffer = bytearray()
        self._max_body = max_body

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next(self) -> bytes | None:
        """The next whole frame's body (taken), or None until more bytes are fed."""
        buffer = self._buffer
        if len(buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(buffer)
        if self._max_body is not None and length > self._max_body:
            raise FrameTooLarge(length)
        end = HEADER.size + length
        if len(buffer) < end:
            return None
        # One copy of the body, not a slice and then a copy of it (a large frame's peak halves):
        # the view is gone once copied, so the buffer can shrink.
        body = bytes(memoryview(buffer)[HEADER.size : end])
        del buffer[:end]
        return body

    def missing(self) -> int:
        """How many more bytes the next frame needs (at least its header's)."""
        if len(self._buffer) < HEADER.size:
            return HEADER.size - len(self._buffer)
        (length,) = HEADER.unpack_from(self._buffer)
        return int(HEADER.size + length - len(self._buffer))
