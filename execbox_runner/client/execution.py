"""One execution from the host's side, over its own WebSocket connection.

This is execbox's host session in Python: send ``execute``, answer every
``tool_call`` (concurrently, as the guest may await several), and return the
``done``. It keeps the host's promises to the runner and to the caller:

- a backstop at ``timeoutMs`` + 100 ms sends ``cancel`` in case the runner
  missed its own deadline, and drops the connection 25 ms later if no
  ``done`` came (the result is then ``timeout``, with no logs);
- cancelling the awaiting task, or an exception from ``observe``, sends ``cancel``,
  waits at most those 25 ms for the ``done`` (so the runner can keep its worker),
  and re-raises;
- a connection that ends before ``done`` raises ``RunnerDisconnected``, a
  frame that is not a runner message ``RunnerProtocolError``;
- every tool call the runner sends is the host's to run, as execbox's host starts
  each one as it comes: once the ``done`` is in, the tools whose calls came just
  before it start (``TOOL_START_S`` at most), then those still running are stopped
  (a plain function's thread is left to finish, its result unused).

An ``observe`` callable (awaited if it returns an awaitable) sees each log line (live from a
runner offering the ``live-logs`` extension, else from the ``done``; each line once, in order)
and each tool call as it comes.
"""

from __future__ import annotations

import inspect
import threading
from dataclasses import dataclass, field
from typing import Any, Final

import anyio
import anyio.abc
import msgspec
from msgspec import UNSET

from ..protocol.messages import Cancel, Done, ErrorInfo, Execute, Log, Started, ToolCall, encode
from . import tracing
from .errors import RunnerDisconnected, RunnerError, RunnerProtocolError
from .events import LogEvent, Observer, ToolCallEvent
from .tools import Providers
from .transport import WebSocket

HOST_BACKSTOP_S: Final = 0.1  # execbox's HOST_TIMEOUT_BACKSTOP_MS
CANCEL_GRACE_S: Final = 0.025  # execbox's DEFAULT_CANCEL_GRACE_MS
# The longest the end of an execution waits for its last tools to start (a plain function waits for
# a thread of anyio's pool, which may all be busy).
TOOL_START_S: Final = 1.0
TIMEOUT_MESSAGE: Final = "Execution timed out"
_RUNNER_TYPES: Final = frozenset({"started", "tool_call", "log", "done"})
_decoder: Final[msgspec.json.Decoder[Started | ToolCall | Log | Done]] = msgspec.json.Decoder(
    Started | ToolCall | Log | Done
)
_any_decoder: Final = msgspec.json.Decoder()


@dataclass(frozen=True)
class ExecuteResult:
    """What an execution produced; ``ok`` says whether ``result`` or ``error`` applies.

    ``result`` is the guest's final value decoded from JSON (``None`` for both
    ``null`` and ``undefined``); ``error`` has one of the stable codes and a
    message; ``logs`` are the guest's console lines as the runner truncated them.
    ``refused`` is true when the runner answered the ``execute`` itself with its
    ``done``, without ``started``: the request was invalid (for example limits
    above the runner's maxima, a ``validation_error``) and no guest code ran.
    """

    ok: bool
    result: Any = None
    error: ErrorInfo | None = None
    logs: list[str] = field(default_factory=list)
    duration_ms: int = 0
    refused: bool = False


class Execution:
    def __init__(
        self, websocket: WebSocket, execute: Execute, providers: Providers, observe: Observer | None = None
    ) -> None:
        self._websocket = websocket
        self._execute = execute
        self._providers = providers
        self._observe = observe
        self._shown = 0  # log lines given to ``observe`` so far
        self._done: Done | None = None
        self._started = False
        self._beginnings: list[threading.Event] = []  # one per tool call: set as its tool starts

    async def run(self) -> ExecuteResult:
        """Run to the ``done`` (or the backstop); always leaves the connection closed."""
        try:
            return await self._run()
        except BaseException:  # cancelled, or ``observe`` raised: tell the runner to stop, show nothing more
            self._observe = None
            with anyio.CancelScope(shield=True):
                await self._cancel()
            raise
        finally:
            if self._done is not None:
                await self._websocket.close()
            else:
                await self._websocket.abort()

    async def _run(self) -> ExecuteResult:
        started_at = anyio.current_time()
        failure: Exception | None = None
        async with anyio.create_task_group() as tools:
            try:
                await self._websocket.send_text(encode(self._execute))
                with anyio.move_on_after(self._execute.options.timeoutMs / 1000 + HOST_BACKSTOP_S):
                    await self._until_done(tools)
            except Exception as exc:  # a ``RunnerError``, or ``observe``'s own: raised below, outside the task
                failure = exc  # group, so that it is not wrapped in a group
            if self._done is not None:
                await self._let_tools_start()
            tools.cancel_scope.cancel()  # the execution is over: stop tools still running
        if failure is not None:
            raise failure
        if self._done is None:
            await self._cancel()
        if self._done is None:
            elapsed_ms = round((anyio.current_time() - started_at) * 1000)
            return ExecuteResult(ok=False, error=ErrorInfo("timeout", TIMEOUT_MESSAGE), duration_ms=elapsed_ms)
        return _result(self._done, refused=not self._started)

    async def _until_done(self, tools: anyio.abc.TaskGroup | None) -> None:
        """Read until this execution's ``done``, answering tool calls in ``tools`` (or ignoring them)."""
        while self._done is None:
            message = _decode(await self._websocket.receive())
            if isinstance(message, ToolCall) and tools is not None:
                await self._show_call(message)
                began = threading.Event()
                self._beginnings.append(began)
                tools.start_soon(self._answer, message, began)
            elif isinstance(message, Log) and message.id == self._execute.id:
                await self._show_lines(message.lines)
            elif isinstance(message, Done) and message.id == self._execute.id:
                self._done = message
                await self._show_lines(message.logs[self._shown :])  # all of them, from a runner without live logs
            elif isinstance(message, Started) and message.id == self._execute.id:
                self._started = True
            # messages about another execution id need no answer

    async def _show_lines(self, lines: list[str]) -> None:
        for line in lines:
            await self._show(LogEvent(line))
        self._shown += len(lines)

    async def _show_call(self, call: ToolCall) -> None:
        if self._observe is not None:
            value = None if call.input is UNSET else msgspec.json.decode(call.input)
            await self._show(ToolCallEvent(call.providerName, call.safeToolName, value))

    async def _show(self, event: LogEvent | ToolCallEvent) -> None:
        """Give ``event`` to ``observe``, awaiting what it returns if that is awaitable (an async ``on_log``)."""
        if self._observe is not None:
            shown = self._observe(event)
            if inspect.isawaitable(shown):
                await shown

    async def _let_tools_start(self) -> None:
        """Wait until every tool called has started (or waits for approval, or failed before)."""
        with anyio.move_on_after(TOOL_START_S):
            while not all(began.is_set() for began in self._beginnings):
                await anyio.sleep(0.001)

    async def _answer(self, call: ToolCall, began: threading.Event) -> None:
        try:
            with tracing.tool_span(call.providerName, call.safeToolName):
                result = await self._providers.answer(call, began.set)
        finally:
            began.set()  # it failed before its tool could start: nothing to wait for
        try:
            await self._websocket.send_text(encode(result))
        except RunnerDisconnected:
            pass  # the reader reports the lost connection

    async def _cancel(self) -> None:
        """Send ``cancel`` and give the runner the grace to answer with its ``done``."""
        if self._done is not None:
            return
        try:
            await self._websocket.send_text(encode(Cancel(id=self._execute.id)))
            with anyio.move_on_after(CANCEL_GRACE_S):
                await self._until_done(None)
        except RunnerError:
            pass  # gone already: the caller gets the timeout (or its cancellation)


def _decode(data: bytes) -> Started | ToolCall | Log | Done | None:
    """A runner message; ``None`` for a message type this client does not know (ignored, as execbox does)."""
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as exc:
        value = _any_decoder.decode(data)
        if isinstance(value, dict) and value.get("type") not in _RUNNER_TYPES:
            return None
        raise RunnerProtocolError(f"the runner sent an invalid message: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RunnerProtocolError(f"the runner sent a frame that is not JSON: {exc}") from None


def _result(done: Done, *, refused: bool) -> ExecuteResult:
    if done.ok:
        value = None if done.result is UNSET else msgspec.json.decode(done.result)
        return ExecuteResult(ok=True, result=value, logs=done.logs, duration_ms=done.durationMs)
    error = done.error if done.error is not UNSET else ErrorInfo("internal_error", "The runner gave no error")
    return ExecuteResult(ok=False, error=error, logs=done.logs, duration_ms=done.durationMs, refused=refused)
