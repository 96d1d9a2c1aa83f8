"""One guest execution in a fresh QuickJS runtime, driven step by step.

``GuestRun`` owns the runtime: it installs the bootstrap and providers, starts
the normalized guest function, runs promise jobs within the wall-clock budget,
and turns what the guest did into ``ipc`` messages. It is synchronous and does
no I/O, so the worker process wraps it in a socket loop and tests drive it
directly.

QuickJS facts this relies on: ``set_time_limit`` counts process CPU time from
the start of each eval or job call (this project's build: from the engine's first
check of the limit in it, see ``native.LAZY_CLOCK``), and several guests may run at once in one
process, so it is only a backstop armed with the remaining wall budget times
the cores (it can never fire early); the worker's interrupter stops a guest at
its wall-clock deadline. Its interrupt is uncatchable by guest code; Python
callables cannot run while a time limit is set, which is why the guest talks
to us only through the bootstrap's outbox, read by ``poll``, and its log lines
through a ring in shared memory (``logring``), which another thread can read
while the guest runs (``stream``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Final

import msgspec
import quickjs

from ..protocol import ipc
from ..protocol.messages import ErrorCode
from . import logring, memory_limit, native
from .failure import BUDGET_MESSAGE, escaped_failure, guest_failure, out_of_memory
from .logring import CAPACITY
from .normalize import Program, Stopped, normalize, standalone
from .runtime import BOOTSTRAP_KEY, MAX_STACK_BYTES, PARSE_STACK_BYTES, Runtime, fresh_runtime

TOO_DEEP_MESSAGE: Final = "Code nested too deeply to parse"
# Code shorter than this cannot nest deeply enough to cost the parsers noticeable time; longer code
# is compiled before tree-sitter normalizes it (``GuestRun._compiles``).
CHECKED_CODE_CHARS: Final = 2048
# A backstop only: process CPU time runs at most this much faster than the wall clock.
_CORES: Final = os.cpu_count() or 1
# CPU time a cancelled guest gets to run its finally blocks and last logs, in each engine call.
ABORT_BUDGET_S: Final = 0.002
# Wall-clock time the unwinding gets as a whole: each job is an engine call of its own, and a guest
# that queues jobs forever (a microtask that queues itself) would otherwise never let go.
UNWIND_S: Final = 0.02
TIMEOUT_MESSAGE: Final = "Execution timed out"
# An execution's error message is cut to this many characters: what a guest throws is a message of
# any size, and with it the frame of its end, whose bound (``ipc.max_frame``)
# the result's, the calls' and the logs' own limits keep to otherwise.
MAX_MESSAGE_CHARS: Final = 1 << 16

# A worker's C heap keeps the pages of runtimes that ended resident (glibc gives back only its
# top): one that held 2,000 parked executions would hold ~450 MiB after they all ended, counted
# against the daemon's memory budget. So the heap is trimmed once runtimes holding this much
# have ended since the last trim, if the worker now holds at most 3/4 of the runtimes it held at
# its peak since then: it shrinks. Under a steady load the freed pages are soon reused, and
# trimming would only fault them in again.
TRIM_AFTER_BYTES: Final = 32 << 20
# What a runtime holds beyond the bytes QuickJS counts, the free blocks of its arenas, at most: in
# a fresh runtime ~69 KiB of the wheel's 4 KiB arenas, ~21 KiB of the tuned build's 2 KiB ones (each
# size class's first arena half that). Only when to trim the heap depends on it.
_RUNTIME_SLACK_BYTES: Final = 16 * native.ARENA_BYTES

# The bootstrap's dispatcher's operations (its ``op``, see bootstrap.js).
_START: Final = 0
_POLL: Final = 1
_SETTLE: Final = 2
_ABORT: Final = 3
_BEGIN: Final = 4

_Call = tuple[int, str, str, bool, msgspec.Raw]
_poll_decoder: Final = msgspec.json.Decoder(tuple[list[_Call], list[str], list[msgspec.Raw] | None])
_int_decoder: Final = msgspec.json.Decoder(int)
_str_decoder: Final = msgspec.json.Decoder(str)
_stack_decoder: Final = msgspec.json.Decoder(str | None)


def _thrown_zero(exc: quickjs.JSException) -> bool:
    """Whether ``exc`` is the ``throw 0`` that a standalone wrapping runs first: the text compiled."""
    return str(exc).split("\n", 1)[0] == "0"


class _Interrupted(Exception):
    """Another thread asked this execution to stop (see ``GuestRun.interrupt``)."""


class _TooDeep(Exception):
    """The guest's code nests too deeply for the engine to compile it (see ``PARSE_STACK_BYTES``)."""


class _Flag:
    """Set once, read from any thread: what ``threading.Event`` offers here, without its
    Condition (~1 KiB for each parked execution)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


class _Shrinking:
    """Whether the worker has shrunk enough since the last trim of its heap (see ``TRIM_AFTER_BYTES``).

    A run dropped without finishing (a worker's bug) stays counted as live.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live = 0
        self._peak = 0
        self._freed = 0

    def started(self) -> None:
        with self._lock:
            self._live += 1
            self._peak = max(self._peak, self._live)

    def ended(self, size: int) -> bool:
        """A runtime of ``size`` bytes is about to be freed; True: trim the heap after it."""
        with self._lock:
            self._live -= 1
            self._freed += size + _RUNTIME_SLACK_BYTES
            if self._freed < TRIM_AFTER_BYTES or 4 * self._live > 3 * self._peak:
                return False
            self._freed = 0
            self._peak = self._live
            return True


_shrinking: Final = _Shrinking()


_NO_PROGRESS: Final = ipc.ToolCalls(calls=[], logs=[])


def _joined(
    logs: list[str], calls: list[ipc.Call], after: ipc.ToolCalls | ipc.Finished
) -> ipc.ToolCalls | ipc.Finished:
    """``after``, the rest of a step's report, with the lines and calls reported before it."""
    if not logs and not calls:
        return after
    if isinstance(after, ipc.Finished):
        return msgspec.structs.replace(after, logs=logs + after.logs, calls=calls + after.calls)
    return ipc.ToolCalls(calls=calls + after.calls, logs=logs + after.logs)


class GuestRun:
    """A guest program from ``Run`` to ``Finished``.

    Call ``start`` once, then ``step`` until it returns ``Finished``; between
    steps feed ``settle`` (tool results) or ``abort`` (cancel or timeout).
    ``interrupt`` may be called from another thread to stop guest code that is
    running now, so that ``abort`` can follow without waiting for it.
    """

    __slots__ = (
        "__weakref__",
        "_interrupt_lock",
        "_max_output",
        "_memory_limit",
        "_refusals_before",
        "_resumed",
        "_run",
        "abort_taken",
        "api",
        "context",
        "deadline",
        "finished",
        "interrupt_requested",
        "memory",
        "program",
        "ring",
        "waiting",
    )
    program: Program  # the guest's code, normalized as the run starts

    def __init__(
        self, run: ipc.Run, runtime: Runtime | None = None, *, arrived: float | None = None, streamed: bool = False
    ) -> None:
        """``arrived``: when the worker received ``run`` (``time.monotonic()``), where its budget
        starts; a run may wait for a runner thread, and that wait is part of its timeout.

        ``streamed``: another thread calls ``stream`` while each step runs (the worker's log pump),
        so the guest's lines go through the runtime's ring, which waits for that reader when it is
        full. Otherwise the lines wait in the runtime until each step's report."""
        self._run: ipc.Run | None = run  # until ``start``: a parked execution keeps only what it needs
        self._max_output = run.max_output_bytes
        self._memory_limit = run.memory_limit
        self.deadline = (time.monotonic() if arrived is None else arrived) + run.budget_s
        runtime = runtime or fresh_runtime()
        self.context = runtime.context
        self.api = runtime.api
        self.ring = runtime.ring  # None: the lines come with each poll
        if not streamed and self.ring is not None:
            with logring.lock:
                self.ring.close()
            self.ring = None
        self.memory = memory_limit.MemoryLimit(self.context, run.memory_limit)
        self._refusals_before = 0  # refusals when the guest last resumed
        _shrinking.started()
        self._resumed = False  # whether a tool result has resumed the guest
        self.waiting: set[int] = set()  # tool calls the guest awaits
        self.finished: ipc.Finished | None = None
        self.interrupt_requested = False
        self.abort_taken = _Flag()
        self._interrupt_lock = threading.Lock()

    # ------------------------------------------------------------------ driving

    def start(self) -> ipc.ToolCalls | ipc.Finished:
        """Normalize the code, evaluate it and call it, then run the first step. Normalizing is part of
        the run: megabytes of code take tree-sitter seconds, which the deadline or a cancel cut short."""
        run, self._run = self._run, None
        assert run is not None, "started twice"
        try:
            self.program = normalize(run.code, self._compiles, self._stopping)
            self._arm()
            main = self._evaluate()
            self.context.set_max_stack_size(MAX_STACK_BYTES)
            self._arm()
            providers = msgspec.json.encode(run.providers).decode()
            # The limits as floats: the binding makes a Python int a 32-bit JavaScript one (2**32 would be 0).
            lines, chars = float(run.max_log_lines), float(run.max_log_chars)
            self.api(_START, providers, lines, chars, BOOTSTRAP_KEY, CAPACITY if self.ring else 0)
            self.api(_BEGIN, main())
            del main  # the runtime is freed as the execution ends: no reference may outlive it
        except _TooDeep:
            return self._finish(False, None, "runtime_error", TOO_DEEP_MESSAGE, [])
        except quickjs.JSException as exc:
            return self._engine_failure(exc)
        except (_Interrupted, Stopped):
            return self._interrupted()
        return self.step()

    def _stopping(self) -> bool:
        """Whether the run must stop now: its deadline has passed, or another thread asked."""
        return self.interrupt_requested or time.monotonic() >= self.deadline

    def _compiles(self, body: str) -> bool:
        """Whether the engine compiles ``body`` (the code, unwrapped) as a function body, asked of long
        code only: normalizing code the engine refuses is of no use, and for code nested too deeply
        to parse it would cost tree-sitter seconds. Runs nothing of the guest's."""
        if len(body) < CHECKED_CODE_CHARS:
            return True
        try:
            self._compile(standalone(body))
        except quickjs.JSException as exc:
            return _thrown_zero(exc)
        except _TooDeep:
            return False
        return True

    def _evaluate(self) -> quickjs.Object:
        """The guest function, from ``source``; it runs nothing of the guest's yet.

        The guest's text must never reach ``source`` where its braces could close the wrapper,
        so a body is parsed alone first; but one without a ``}`` cannot close it (no token of it
        is a closing brace), and is evaluated at once: a trivial execution's second compile. It
        is parsed alone only if it does not evaluate, so that its syntax error is the one every
        other body reports.
        """
        if "}" in self.program.body:
            self._parse_alone()
            return self._compile(self.program.source)
        try:
            return self._compile(self.program.source)
        except quickjs.JSException:
            self._parse_alone()
            raise

    def _parse_alone(self) -> None:
        """Raise QuickJS's SyntaxError unless the body parses as one function body (see ``normalize``).

        The guest's text must never reach ``source`` where its braces could
        close the wrapper; the standalone text throws before anything in it runs.
        """
        try:
            self._compile(self.program.standalone)
        except quickjs.JSException as exc:
            if not _thrown_zero(exc):
                raise

    def _compile(self, text: str) -> quickjs.Object:
        """Evaluate ``text``, a wrapping of the guest's code that runs none of it, with the engine's
        stack bounded (``PARSE_STACK_BYTES``). Raises ``_TooDeep`` when it nests too deeply: the
        parser ran out of stack, or failed at a point that moves when it has half as much (QuickJS
        reports some of those as a syntax error where it stopped, "missing formal parameter").
        Running out of memory is not nesting, though it too fails elsewhere with half the stack: it
        is raised as it came, for ``memory_limit``."""
        try:
            return self.context.eval(text)
        except quickjs.StackOverflow:
            raise _TooDeep from None
        except quickjs.JSException as exc:
            failure = str(exc)
            if (
                not _thrown_zero(exc)
                and not out_of_memory(failure, refused=self._refused())
                and self._fails_otherwise(text, failure)
            ):
                raise _TooDeep from None
            raise

    def _fails_otherwise(self, text: str, failure: str) -> bool:
        """Whether ``text`` does not fail as ``failure`` with half the parse stack."""
        self.context.set_max_stack_size(PARSE_STACK_BYTES // 2)
        try:
            self.context.eval(text)
        except quickjs.JSException as exc:
            return str(exc) != failure
        finally:
            self.context.set_max_stack_size(PARSE_STACK_BYTES)
        return True

    def step(self, *, armed: bool = False) -> ipc.ToolCalls | ipc.Finished:
        """Run every runnable job, then report what the guest did; ``armed``: the backstop was armed
        just before (``settle``).

        The backstop is armed once for the step: a job later in it gets what was left of the
        budget as the step began, more than is left, so it still never fires early; the wall-clock
        deadline and an interrupt are checked before every job.

        The tool inputs of one report fit within ``max_output_bytes`` together, as its frame must
        (the daemon loses a worker that sends a larger one, and every execution it hosts): calls
        past that room are rejected in the guest like an unserializable input, and the guest runs
        on in this step, with what is left of the room for the calls it makes next."""
        if self.finished is not None:
            return self.finished
        room = self._max_output
        logs: list[str] = []
        forwarded: list[ipc.Call] = []
        while True:
            ran = self._run_jobs(armed)
            if not isinstance(ran, tuple):  # the engine failed, or the guest was interrupted
                return _joined(logs, forwarded, ran)
            calls, lines, outcome = ran
            logs += self._logged(lines)
            more, oversized, room = self._forwardable(calls, room)
            forwarded += more
            if outcome is not None:  # calls it never awaited still go out; any too big to, cannot now fail it
                return self._outcome(outcome, logs, forwarded)
            if not oversized:
                return ipc.ToolCalls(calls=forwarded, logs=logs)
            rejected = self._reject(oversized)
            if rejected is not None:
                return _joined(logs, forwarded, rejected)
            armed = True  # for these rejections and the jobs after them

    def _run_jobs(
        self, armed: bool
    ) -> tuple[list[_Call], list[str], list[msgspec.Raw] | None] | ipc.ToolCalls | ipc.Finished:
        """Run every runnable job, then poll what the guest did: its calls, lines and outcome; or
        how the execution ended meanwhile (its deadline, an engine failure), or an interrupt's answer."""
        try:
            if not armed:
                self._arm()
            while True:
                if time.monotonic() >= self.deadline:
                    return self._finish(False, None, "timeout", TIMEOUT_MESSAGE, *self._salvage())
                if self.interrupt_requested:
                    raise _Interrupted
                if not self.context.execute_pending_job():
                    break
            return _poll_decoder.decode(self.api(_POLL))
        except quickjs.JSException as exc:
            return self._engine_failure(exc)
        except _Interrupted:
            return self._interrupted()

    def _reject(self, oversized: list[int]) -> ipc.ToolCalls | ipc.Finished | None:
        """Reject the calls too big to send in the guest, like any unserializable input; None, or how
        the execution ended meanwhile, or an interrupt's answer."""
        message = f"Guest code passed tool input larger than the runner's limit of {self._max_output} bytes"
        try:
            self._arm()  # once, for these rejections and the jobs after them
            for call_id in oversized:
                self.api(_SETTLE, call_id, False, None, "serialization_error", json.dumps(message))
        except quickjs.JSException as exc:
            return self._engine_failure(exc)
        except _Interrupted:
            return self._interrupted()
        return None

    def _forwardable(self, calls: list[_Call], room: int) -> tuple[list[ipc.Call], list[int], int]:
        """The calls of one report that fit within ``room`` bytes together, now awaited (``waiting``),
        the ids of those that do not, and the room left."""
        forwarded: list[ipc.Call] = []
        oversized: list[int] = []
        for call_id, provider, tool, has_input, raw in calls:
            data = bytes(raw) if has_input else None
            size = len(data or b"")
            if size > room:
                oversized.append(call_id)
            else:
                room -= size
                self.waiting.add(call_id)
                forwarded.append((call_id, provider, tool, data))
        return forwarded, oversized, room

    def settle(self, *messages: ipc.Settle) -> ipc.ToolCalls | ipc.Finished:
        """Resolve or reject the tool calls ``messages`` answer, in order, then run one step: the
        results of calls made in parallel, arrived together, resume the guest once."""
        if self.finished is not None:
            return self.finished
        self._refusals_before = self.memory.refusals  # the guest resumes: older refusals are not its failure's
        self._resumed = True
        try:
            self._arm()  # once, for these calls and the step after them (see ``step``)
            for message in messages:
                if message.call_id not in self.waiting:
                    continue
                self.waiting.discard(message.call_id)
                value = None if message.value is None else message.value.decode()
                self.api(_SETTLE, message.call_id, message.ok, value, message.code, message.message)
        except quickjs.JSException as exc:
            return self._engine_failure(exc)
        except _Interrupted:
            return self._interrupted()
        return self.step(armed=True)

    def interrupt(self) -> bool:
        """From another thread: stop the guest code running now. False once ``abort`` has begun.

        The caller repeats it until it returns False, because an engine call
        that starts just after a poke re-arms its own limit.
        """
        with self._interrupt_lock:
            if self.abort_taken.is_set() or self.finished is not None:
                return False
            self.interrupt_requested = True
            native.poke(self.context)
            native.let_go(self.context)  # a held guest takes the poke now, not at its next turn
            return True

    def hold(self) -> bool:
        """From another thread: make the guest code running now wait at its next interrupt check
        until ``let_go`` (the worker's share, ``turns.py``). False once it is ending or asked to stop."""
        with self._interrupt_lock:
            if self.abort_taken.is_set() or self.interrupt_requested or self.finished is not None:
                return False
            native.hold(self.context)
            return True

    def let_go(self) -> None:
        """From another thread: end ``hold``."""
        with self._interrupt_lock:
            if self.finished is None:  # else its runtime is gone, and nothing of it waits
                native.let_go(self.context)

    def _interrupted(self) -> ipc.ToolCalls | ipc.Finished:
        """Stopped from another thread. At its deadline the worker ends the execution itself, as
        the daemon's Abort would (the guest unwinds, its logs kept), so that a ``done`` need not
        wait for that Abort; before it, an Abort is on its way and collects the logs."""
        if time.monotonic() >= self.deadline:
            return self.abort()
        return _NO_PROGRESS

    def _stop_interrupts(self) -> None:
        """Before the last engine calls of an execution: no more pokes, they would cut those short."""
        with self._interrupt_lock:
            self.abort_taken.set()

    def abort(self) -> ipc.Finished:
        """Reject pending tools with timeout, let the guest unwind briefly, and stop."""
        self._stop_interrupts()
        if self.finished is not None:
            return self.finished
        logs, calls = self._salvage()  # what the guest did before it was stopped
        unwound_by = time.monotonic() + UNWIND_S
        try:
            self.context.set_time_limit(ABORT_BUDGET_S)
            self.api(_ABORT)
            while time.monotonic() < unwound_by and self.context.execute_pending_job():
                pass
        except quickjs.JSException:
            pass  # the unwinding guest ran out of its budget; what it logged is still collected
        unwound, _ = self._salvage()  # the calls it makes as it unwinds are refused
        return self._finish(False, None, "timeout", TIMEOUT_MESSAGE, logs + unwound, calls)

    def evict(self) -> ipc.Finished:
        """The daemon's memory budget is spent and this is its largest guest: end it now with
        ``memory_limit``, without letting it unwind (which would allocate)."""
        self._stop_interrupts()
        if self.finished is not None:
            return self.finished
        return self._finish(False, None, "memory_limit", BUDGET_MESSAGE, *self._salvage())

    # ------------------------------------------------------------------ outcomes

    def _arm(self) -> None:
        """Re-arm the CPU-time backstop with what is left of the wall budget (see the module docstring)."""
        if self.interrupt_requested:
            raise _Interrupted
        self.context.set_time_limit(max(self.deadline - time.monotonic(), 0.001) * _CORES)

    def _outcome(self, outcome: list[msgspec.Raw], logs: list[str], calls: list[ipc.Call]) -> ipc.Finished:
        status = _int_decoder.decode(outcome[0])
        if status == 1:
            result = bytes(outcome[1])
            if len(result) > self._max_output:
                message = f"Guest code returned a value of {len(result)} bytes, over the runner's limit of {self._max_output} bytes"
                return self._finish(False, None, "serialization_error", message, logs, calls)
            return self._finish(True, result, None, "", logs, calls)
        if status == 2:
            return self._finish(True, None, None, "", logs, calls)
        if status == 3:
            code: ErrorCode = msgspec.json.decode(outcome[1], type=ErrorCode)
            return self._finish(False, None, code, _str_decoder.decode(outcome[2]), logs, calls)
        code, message = guest_failure(
            _str_decoder.decode(outcome[1]),
            _stack_decoder.decode(outcome[2]),
            self.program,
            refused=self._refused(),
            memory_limit=self._memory_limit,
            resumed=self._resumed,
        )
        return self._finish(False, None, code, message, logs, calls)

    def _refused(self) -> bool | None:
        """Whether an allocation was refused since the guest last resumed; None if not counted."""
        return self.memory.refusals > self._refusals_before if self.memory.counts else None

    def _engine_failure(self, exc: quickjs.JSException) -> ipc.ToolCalls | ipc.Finished:
        """An exception that escaped to Python: an interrupt, or see ``failure.escaped_failure``."""
        text = str(exc)
        interrupted = text.split("\n", 1)[0] == "InternalError: interrupted"
        if interrupted and self.interrupt_requested:
            return self._interrupted()
        logs, calls = self._salvage()
        if interrupted:
            return self._finish(False, None, "timeout", TIMEOUT_MESSAGE, logs, calls)
        code, message = escaped_failure(text, self.program, refused=self._refused())
        return self._finish(False, None, code, message, logs, calls)

    def stream(self, send: Callable[[list[str]], None]) -> None:
        """(From another thread, while the guest may be running.) ``send`` the lines logged since the
        last report now, holding the rings' lock: nothing read here reaches the daemon after the
        execution's last message, whose lines are read under the same lock."""
        if self.ring is None:
            return
        with logring.lock:
            lines = self.ring.read()
            if lines:
                send(lines)

    def last_logs(self) -> list[str]:
        """The lines not reported yet, for the execution's last message (its ``Finished``, or the
        worker's when a bug ends it); the ring goes back to the pool, and nothing is streamed after."""
        if self.ring is None:
            return []
        with logring.lock:
            return self.ring.close()

    def _logged(self, polled: list[str]) -> list[str]:
        """The lines logged since the last report: from the ring, or without one, those ``polled``."""
        if self.ring is None:
            return polled
        with logring.lock:
            return self.ring.read()

    def _salvage(self) -> tuple[list[str], list[ipc.Call]]:
        """Best effort, as the execution ends without its outcome (an engine failure, a timeout):
        the lines logged and the tool calls made since the last report, if the runtime can still
        say (the calls too big to send are left out: the guest can no longer be told)."""
        self._stop_interrupts()
        try:
            self.context.set_time_limit(ABORT_BUDGET_S)
            calls, logs, _ = _poll_decoder.decode(self.api(_POLL))
        except (quickjs.JSException, msgspec.DecodeError):
            return [], []
        return logs, self._forwardable(calls, self._max_output)[0]

    def _finish(
        self,
        ok: bool,
        result: bytes | None,
        code: ErrorCode | None,
        message: str,
        logs: list[str],
        calls: list[ipc.Call] | None = None,
    ) -> ipc.Finished:
        logs = logs + self.last_logs()  # the ring's last lines; its slot goes back to the pool
        message = message[:MAX_MESSAGE_CHARS]
        self.finished = ipc.Finished(ok=ok, result=result, code=code, message=message, logs=logs, calls=calls or [])
        self._release()
        return self.finished

    def _release(self) -> None:
        """Free the runtime as the execution ends, not when this object goes (a runner thread may
        hold it until it takes other work), and trim the heap when the worker has shrunk.

        Nothing calls into the engine once ``finished`` is set; ``interrupt`` pokes only under
        its lock, and refuses once the abort is taken.
        """
        self._stop_interrupts()
        native.let_go(self.context)  # a hold that an engine call ended leaves its gate behind
        size = self.memory.release()
        del self.api, self.context
        if _shrinking.ended(size):
            memory_limit.trim_heap()
