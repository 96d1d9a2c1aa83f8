"""The runner side of one execbox session, as a pure state machine.

``Session`` owns every rule of the specification's session model: ``started``
once before any ``tool_call`` or ``done``, ``tool_call``/``tool_result``
correlated by ``callId``, exactly one ``done`` per execution, nothing for an
execution after its ``done``, the answer to a second ``execute``, cancellation
and the wall-clock timeout, and the answer to every malformed frame.

It knows nothing of sockets, processes or trio (Sans-I/O): the connection
feeds it host frames, worker messages, timer expiries and transport closure,
each with the current monotonic time, and performs the actions it returns.
``deadline`` says when the connection must next call ``timer``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeAlias

from msgspec import UNSET, Raw, UnsetType

from . import ipc
from .messages import (
    ERROR_CODES,
    BadJSON,
    BadMessage,
    Cancel,
    Done,
    ErrorCode,
    ErrorInfo,
    Execute,
    Log,
    Started,
    ToolCall,
    ToolFailure,
    ToolResult,
    checked_json,
    decode_host,
    encode,
)

TIMEOUT_MESSAGE: Final = "Execution timed out"
ALREADY_ACTIVE_MESSAGE: Final = "An execution is already active on this session"
SHUTDOWN_MESSAGE: Final = "the runner is shutting down"

# WebSocket close codes (RFC 6455) for frames that cannot be answered with a ``done``.
CLOSE_GOING_AWAY: Final = 1001  # the daemon is shutting down
CLOSE_UNSUPPORTED_DATA: Final = 1003  # binary frame
CLOSE_INVALID_PAYLOAD: Final = 1007  # not JSON
CLOSE_POLICY_VIOLATION: Final = 1008  # JSON, but not a valid host message (nested too deeply included)


@dataclass(frozen=True, slots=True)
class SendToHost:
    data: bytes


@dataclass(frozen=True, slots=True)
class StartRun:
    """Acquire a worker and send it ``run``."""

    run: ipc.Run


@dataclass(frozen=True, slots=True)
class SendToWorker:
    message: ipc.Settle | ipc.Abort


@dataclass(frozen=True, slots=True)
class ReleaseWorker:
    """The execution no longer needs its worker slot. ``misbehaved``: the worker sent something
    invalid, so it may be taken over and must host nothing more."""

    misbehaved: bool = False


@dataclass(frozen=True, slots=True)
class CloseTransport:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class ExecutionEnded:
    """An execute came to its end (for metrics and logs; sends nothing).

    ``outcome`` is ``ok``, ``error`` (a ``done`` with ``code``) or ``abandoned``
    (the host went away before its ``done``).
    """

    id: str
    outcome: str
    code: ErrorCode | None
    duration_s: float
    tool_calls: int
    tool_latencies_s: tuple[float, ...]
    guest_code: str  # for operators who log it; "" for a refused execute
    unknown_tool_codes: tuple[str, ...] = ()  # tool_result error codes outside the stable set, as sent
    # For traces: each tool call's (callId, "provider.tool", seconds from the execute to its tool_call,
    # seconds it took or None if never answered), and the seconds from the execute to a cancel.
    tool_call_times: tuple[tuple[str, str, float, float | None], ...] = ()
    cancelled_after_s: float | None = None


Action: TypeAlias = SendToHost | StartRun | SendToWorker | ReleaseWorker | CloseTransport | ExecutionEnded


class Phase(enum.Enum):
    IDLE = "idle"  # waiting for an execute
    RUNNING = "running"  # started sent, worker executing or waiting on tools
    ABORTING = "aborting"  # timed out or cancelled; waiting briefly for the worker's last logs
    CLOSED = "closed"  # transport gone or closed by us


class _Misbehaved(Exception):
    """A worker sent what it cannot have sent: the execution ends with ``internal_error``."""


@dataclass(slots=True)
class _Execution:
    id: str
    code: str
    started_at: float
    deadline: float
    tools: frozenset[tuple[str, str]]
    logs: list[str]
    log_lines_left: int
    log_chars_left: int  # UTF-16 code units, as JavaScript counts them
    # callId -> (worker call id, when the tool_call went out, "provider.tool")
    pending: dict[str, tuple[int, float, str]]
    issued: set[int]  # every worker call id seen, to refuse repeats
    calls: list[tuple[str, str, float, float | None]]  # callId, "provider.tool", sent, answered (or None)
    cancelled_at: float | None  # when the host's cancel came
    unknown_codes: list[str]  # failing tool_results' codes outside the stable set

    def add_logs(self, lines: list[str]) -> list[str]:
        """Keep what the specification's truncation keeps, as the worker should have:
        a worker may be hostile, so its logs are cut here too, as they arrive. The lines kept."""
        kept: list[str] = []
        for line in lines:
            if self.log_lines_left <= 0 or self.log_chars_left <= 0:
                break
            clipped, units = _clip_utf16(line, self.log_chars_left)
            self.log_lines_left -= 1
            self.log_chars_left -= units
            kept.append(clipped)
        self.logs += kept
        return kept

    def give_up_pending(self) -> None:
        """The tool calls still awaiting their result will have none: kept as never answered."""
        if self.pending:
            self.calls += [(call, name, sent_at, None) for call, (_, sent_at, name) in self.pending.items()]
            self.pending.clear()


class Session:
    """One WebSocket session: a sequence of executions, one active at a time."""

    def __init__(
        self,
        *,
        cancel_grace: float = 0.010,
        timeout_grace: float = 0.020,
        max_output_bytes: int = 16 << 20,
        max_timeout_ms: float = 300_000,
        max_memory_limit_bytes: int = 512 << 20,
        admit: Callable[[str, int], str | None] | None = None,
    ) -> None:
        # How long an aborted worker gets to hand over its last logs before
        # ``done`` goes out without them. After a cancel the host force-closes
        # 25 ms later; our own timeout fires 100 ms before the host's backstop.
        self.cancel_grace = cancel_grace
        self.timeout_grace = timeout_grace
        # Bounds what one execution can make the runner send: results and tool
        # inputs (enforced in the worker) and logs (both log limits are capped at
        # a sixth of it: a character takes at most six bytes of JSON, an escape,
        # and a line at least three, its quotes and comma).
        self.max_output_bytes = max_output_bytes
        # The operator's ceilings: an execute asking for more is refused, not clamped,
        # so a host never gets a limit it did not ask for.
        self.max_timeout_ms = max_timeout_ms
        self.max_memory_limit_bytes = max_memory_limit_bytes
        # Asked with each valid execute's id and memoryLimitBytes as it arrives: why the runner starts
        # no execution for this session now (its tenant at a quota), refused with ``internal_error``
        # and that reason; or None.
        self._admit = admit
        self.phase = Phase.IDLE
        self.deadline: float | None = None
        # The ``live-logs`` extension (``extensions``), turned on at the handshake: log lines go to
        # the host as they arrive, each also in the ``done``.
        self.live_logs = False
        self._exec: _Execution | None = None
        self._draining = False  # the daemon drains: no new execution, the session closes once idle
        self._shutting_down = False  # ... and the running execution is cancelled
        # Tool calls sent on this connection: their ids are unique within it, so that a late
        # ``tool_result`` for an execution that ended can never answer a later one's call.
        self._calls = 0

    @property
    def execution_id(self) -> str | None:
        return self._exec.id if self._exec else None

    # ------------------------------------------------------------------ host input

    def receive_text(self, data: bytes | str, now: float) -> list[Action]:
        if self.phase is Phase.CLOSED:
            return []
        try:
            message = decode_host(data)
        except BadMessage as bad:
            return self._bad_message(bad, now)
        if isinstance(message, Execute):
            return self._execute(message, now)
        if isinstance(message, Cancel):
            if self._exec is not None and self.phase is Phase.RUNNING and message.id == self._exec.id:
                self._exec.cancelled_at = now
                return self._abort(now, self.cancel_grace)
            return []  # a cancel for another (or no) execution is ignored
        return self._tool_result(message, now)

    def receive_binary(self, now: float) -> list[Action]:
        if self.phase is Phase.CLOSED:
            return []
        return self._fail_and_close(
            now, CLOSE_UNSUPPORTED_DATA, "binary frames are not supported; send JSON text frames"
        )

    def transport_closed(self, now: float) -> list[Action]:
        """The host went away: the execution ends without a ``done``."""
        ex = self._exec
        self._end()
        self.phase = Phase.CLOSED
        if ex is None:
            return []
        return [ReleaseWorker(), _record(ex, now, "abandoned", None)]

    def _execute(self, message: Execute, now: float) -> list[Action]:
        if self._exec is not None:
            return self._already_active(message.id, now)
        options = message.options
        if options.timeoutMs > self.max_timeout_ms:
            return _rejected(
                message.id,
                "validation_error",
                f"timeoutMs {_plain(options.timeoutMs)} exceeds this runner's maximum of {_plain(self.max_timeout_ms)}",
            )
        memory_limit = int(options.memoryLimitBytes)
        if memory_limit > self.max_memory_limit_bytes:
            return _rejected(
                message.id,
                "validation_error",
                f"memoryLimitBytes {memory_limit} exceeds this runner's maximum of {self.max_memory_limit_bytes}",
            )
        if self._admit is not None and (refusal := self._admit(message.id, memory_limit)) is not None:
            return _rejected(message.id, "internal_error", refusal)
        deadline = now + options.timeoutMs / 1000
        # Any log limit a host can write works, as the largest this runner keeps (see ``LogLimit``).
        max_log_lines = min(int(options.maxLogLines), self.max_output_bytes // 6)
        max_log_chars = min(int(options.maxLogChars), self.max_output_bytes // 6)
        providers = [(p.name, [t.safeName for t in p.tools.values()]) for p in message.providers]
        self._exec = _Execution(
            id=message.id,
            code=message.code,
            started_at=now,
            deadline=deadline,
            tools=frozenset((name, tool) for name, tools in providers for tool in tools),
            logs=[],
            log_lines_left=max_log_lines,
            log_chars_left=max_log_chars,
            pending={},
            issued=set(),
            calls=[],
            cancelled_at=None,
            unknown_codes=[],
        )
        self.phase = Phase.RUNNING
        self.deadline = deadline
        run = ipc.Run(
            code=message.code,
            budget_s=options.timeoutMs / 1000,
            memory_limit=memory_limit,
            max_log_lines=max_log_lines,
            max_log_chars=max_log_chars,
            providers=providers,
            max_output_bytes=self.max_output_bytes,
        )
        return [SendToHost(encode(Started(id=message.id))), StartRun(run)]

    def _tool_result(self, message: ToolResult, now: float) -> list[Action]:
        ex = self._exec
        if ex is None or self.phase is not Phase.RUNNING:
            return []
        pending = ex.pending.pop(message.callId, None)
        if pending is None:
            return []  # unknown or already settled callId: ignored
        call_id, sent_at, name = pending
        ex.calls.append((message.callId, name, sent_at, now))
        if message.ok:
            value = None if message.result is UNSET else bytes(message.result)
            return [SendToWorker(ipc.Settle(call_id=call_id, ok=True, value=value))]
        error = message.error
        assert isinstance(error, ToolFailure)  # guaranteed by ToolResult.__post_init__
        code = error.code
        if code not in ERROR_CODES:
            # Liberal in what we accept: the guest sees a trusted tool_error, the log the host's code.
            ex.unknown_codes.append(code)
            code = "tool_error"
        return [SendToWorker(ipc.Settle.reject(call_id, code, error.message))]

    def _bad_message(self, bad: BadMessage, now: float) -> list[Action]:
        if bad.execute_id is not None:
            if self._exec is not None:
                return self._already_active(bad.execute_id, now)
            return _rejected(bad.execute_id, "validation_error", f"Invalid execute message: {bad.detail}")
        code = CLOSE_INVALID_PAYLOAD if bad.kind == "json" else CLOSE_POLICY_VIOLATION
        return self._fail_and_close(now, code, bad.detail)

    def _already_active(self, exec_id: str, now: float) -> list[Action]:
        """A second ``execute`` gets its own ``done``. If it reuses the active
        execution's id, that ``done`` is the active one's too: a ``done`` is the
        last word for its id, so the active execution ends with it."""
        assert self._exec is not None
        if exec_id == self._exec.id:
            return self._conclude(now, ReleaseWorker(), "internal_error", ALREADY_ACTIVE_MESSAGE)
        return _rejected(exec_id, "internal_error", ALREADY_ACTIVE_MESSAGE)

    def _fail_and_close(self, now: float, code: int, reason: str) -> list[Action]:
        """A frame nobody can act on: fail the active execution, then close. One already cancelled or
        past its deadline has its outcome, as when its worker is lost: ``timeout``."""
        actions: list[Action] = []
        if self.phase is Phase.ABORTING:
            actions = self._finish_timeout(now, ReleaseWorker())
        elif self._exec is not None:
            actions = self._conclude(now, ReleaseWorker(), "validation_error", f"Protocol error: {reason}")
        self.phase = Phase.CLOSED
        actions.append(CloseTransport(code, _close_reason(reason)))
        return actions

    # ------------------------------------------------------------------ worker input

    def worker_tool_calls(self, message: ipc.ToolCalls, now: float) -> list[Action]:
        ex = self._exec
        if ex is None:
            return []
        logged = self._logged(ex, message.logs)
        try:
            return logged + self._tool_calls(ex, message.calls, now)
        except _Misbehaved as exc:
            return logged + self.worker_lost(now, str(exc), misbehaved=True)

    def _tool_calls(self, ex: _Execution, calls: list[ipc.Call], now: float) -> list[Action]:
        """A ``tool_call`` for each call the guest made, now pending. A worker stopped at its timeout
        reports the calls the guest made before it was stopped (it refuses those it makes as it
        unwinds): they go out too, as the guest made them. After the host's cancel, or as the
        daemon stops, none does. Raises ``_Misbehaved`` for a call the worker cannot have made."""
        stopped_on_request = ex.cancelled_at is not None or self._shutting_down
        if self.phase not in (Phase.RUNNING, Phase.ABORTING) or stopped_on_request:
            return []
        actions: list[Action] = []
        for call_id, provider, tool, input_json in calls:
            if call_id in ex.issued or (provider, tool) not in ex.tools:
                raise _Misbehaved("worker sent an invalid tool call")
            try:
                tool_input = UNSET if input_json is None else checked_json(input_json)
            except BadJSON as exc:
                raise _Misbehaved(f"worker sent an invalid tool input ({exc})") from None
            ex.issued.add(call_id)
            self._calls += 1
            call = f"call-{self._calls}"
            ex.pending[call] = (call_id, now, f"{provider}.{tool}")
            actions.append(
                SendToHost(encode(ToolCall(callId=call, providerName=provider, safeToolName=tool, input=tool_input)))
            )
        return actions

    def worker_finished(self, message: ipc.Finished, now: float) -> list[Action]:
        ex = self._exec
        if ex is None:
            return []
        logged = self._logged(ex, message.logs)
        release = ReleaseWorker()
        try:
            # Calls the guest made and never awaited: the host hears of every call, before the done.
            logged += self._tool_calls(ex, message.calls, now)
        except _Misbehaved as exc:
            return logged + self.worker_lost(now, str(exc), misbehaved=True)
        if self.phase is Phase.ABORTING:
            return logged + self._finish_timeout(now, release)
        if message.ok:
            try:
                result = UNSET if message.result is None else checked_json(message.result)
            except BadJSON as exc:
                return logged + self.worker_lost(now, f"worker sent an invalid result ({exc})", misbehaved=True)
            return logged + self._conclude(now, release, result=result)
        # A timeout reported by the worker is its own deadline (the message says so) or a host's failing
        # tool_result with code timeout, which keeps the host's message like any other.
        return logged + self._conclude(now, release, message.code or "internal_error", message.message)

    def _logged(self, ex: _Execution, lines: list[str]) -> list[Action]:
        """Keep a worker's log lines; with live logs on, send the kept ones to the host at once."""
        kept = ex.add_logs(lines) if lines else lines
        return [SendToHost(encode(Log(id=ex.id, lines=kept)))] if kept and self.live_logs else []

    def worker_lost(
        self, now: float, detail: str = "worker process exited unexpectedly", *, misbehaved: bool = False
    ) -> list[Action]:
        """The worker died or misbehaved: ``internal_error``, or ``timeout`` if already aborting."""
        ex = self._exec
        if ex is None:
            return []
        release = ReleaseWorker(misbehaved=misbehaved)
        if self.phase is Phase.ABORTING:
            return self._finish_timeout(now, release)
        return self._conclude(now, release, "internal_error", f"Runner failure: {detail}")

    # ------------------------------------------------------------------ time

    def timer(self, now: float) -> list[Action]:
        if self.deadline is None or now < self.deadline:
            return []
        if self.phase is Phase.RUNNING:
            return self._abort(now, self.timeout_grace)
        if self.phase is Phase.ABORTING:
            return self._finish_timeout(now, ReleaseWorker())
        return []

    def _abort(self, now: float, grace: float) -> list[Action]:
        """Cancel or timeout: ask the worker to unwind, answer after ``grace`` at most."""
        assert self._exec is not None
        self.phase = Phase.ABORTING
        self._exec.give_up_pending()
        self.deadline = now + grace
        return [SendToWorker(ipc.Abort())]

    def _finish_timeout(self, now: float, release: ReleaseWorker) -> list[Action]:
        return self._conclude(now, release, "timeout", TIMEOUT_MESSAGE)

    def _conclude(
        self,
        now: float,
        release: ReleaseWorker,
        code: ErrorCode | None = None,
        message: str = "",
        result: Raw | UnsetType = UNSET,
    ) -> list[Action]:
        """The one way an accepted execution ends: its ``done`` (a result, or ``code``
        and ``message``), the worker released, the record of it, and, when the daemon
        is shutting down, the close that follows."""
        ex = self._exec
        assert ex is not None
        if code is None:
            done = Done(id=ex.id, ok=True, durationMs=_elapsed_ms(ex, now), logs=ex.logs, result=result)
        else:
            done = Done(
                id=ex.id,
                ok=False,
                durationMs=_elapsed_ms(ex, now),
                logs=ex.logs,
                error=ErrorInfo(code=code, message=message),
            )
        self._end()
        actions: list[Action] = [
            SendToHost(encode(done)),
            release,
            _record(ex, now, "ok" if code is None else "error", code),
        ]
        if self._draining:
            self.phase = Phase.CLOSED
            actions.append(CloseTransport(CLOSE_GOING_AWAY, SHUTDOWN_MESSAGE))
        return actions

    def drain(self) -> list[Action]:
        """The daemon drains: a running execution may still finish, but none starts after it, as it
        could not finish either. The connection closes with 1001 once idle (now, if it is), and the
        host takes its next execute to another runner."""
        if self.phase is Phase.CLOSED or self._draining:
            return []
        self._draining = True
        if self._exec is not None:
            return []  # the close follows its done
        self.phase = Phase.CLOSED
        return [CloseTransport(CLOSE_GOING_AWAY, SHUTDOWN_MESSAGE)]

    def shutdown(self, now: float) -> list[Action]:
        """The daemon is stopping: a running execution is cancelled (it still gets its
        ``done``, as ``timeout``), then the connection closes with 1001."""
        if self.phase is Phase.CLOSED or self._shutting_down:
            return []
        self._shutting_down = True
        if self.phase is Phase.RUNNING:
            self._draining = True
            return self._abort(now, self.cancel_grace)
        return self.drain()  # an aborting execution's done is on the way, and the close follows it

    def _end(self) -> None:
        self._exec = None
        self.deadline = None
        if self.phase is not Phase.CLOSED:
            self.phase = Phase.IDLE


def _elapsed_ms(ex: _Execution, now: float) -> int:
    return max(0, round((now - ex.started_at) * 1000))


def _plain(number: float) -> str:
    """A number in a message as a host wrote it: a whole one as an integer (``:g`` made
    999999999 "1e+09"), any other exactly."""
    return str(int(number)) if float(number).is_integer() else repr(number)


def _rejected(exec_id: str, code: ErrorCode, message: str) -> list[Action]:
    """An execute refused before it started: its own ``done``, and its record."""
    done = Done(id=exec_id, ok=False, durationMs=0, logs=[], error=ErrorInfo(code=code, message=message))
    return [SendToHost(encode(done)), ExecutionEnded(exec_id, "error", code, 0.0, 0, (), "")]


def _record(ex: _Execution, now: float, outcome: str, code: ErrorCode | None) -> ExecutionEnded:
    ex.give_up_pending()  # the host went away, or the worker was lost, while they were awaited
    return ExecutionEnded(
        ex.id,
        outcome,
        code,
        now - ex.started_at,
        len(ex.issued),
        tuple(answered - sent_at for _, _, sent_at, answered in ex.calls if answered is not None),
        ex.code,
        tuple(ex.unknown_codes),
        tuple(
            (call, name, sent_at - ex.started_at, None if answered is None else answered - sent_at)
            for call, name, sent_at, answered in ex.calls
        ),
        None if ex.cancelled_at is None else ex.cancelled_at - ex.started_at,
    )


def _clip_utf16(line: str, limit: int) -> tuple[str, int]:
    """``line`` cut to ``limit`` UTF-16 code units, and its length in them; a pair
    cut in half leaves U+FFFD, as the worker's ``toWellFormed`` does."""
    if line.isascii() and len(line) <= limit:
        return line, len(line)
    units = line[:limit].encode("utf-16-le", "surrogatepass")  # ``limit`` characters hold enough units
    if len(units) <= 2 * limit:
        return line[:limit], len(units) // 2
    return units[: 2 * limit].decode("utf-16-le", "replace"), limit


def _close_reason(reason: str) -> str:
    """A close reason must fit a control frame: at most 123 bytes of UTF-8."""
    encoded = reason.encode()
    if len(encoded) <= 123:
        return reason
    return encoded[:120].decode(errors="ignore") + "..."
