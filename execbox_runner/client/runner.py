"""``Runner``: run guest JavaScript on an execbox runner against your own Python tools.

A ``Runner`` is an address and credentials, not a connection: every execution
opens its own WebSocket connection, as execbox hosts do, so executions run
concurrently and one failing connection touches no other execution. The same
object works from asyncio, from trio (through anyio) and from synchronous code.
"""

from __future__ import annotations

import contextlib
import difflib
import math
import ssl
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from types import TracebackType
from typing import Final, TypedDict, Unpack

import anyio
import anyio.to_thread
import msgspec
import sniffio
from anyio.streams.memory import MemoryObjectReceiveStream

from ..protocol import extensions
from ..protocol.messages import Execute, RuntimeOptions
from . import tracing
from .errors import QuotaExceeded, RunnerBusy, RunnerError, RunnerUnavailable
from .events import DoneEvent, Event, LogEvent, Observer, ToolCallEvent
from .execution import ExecuteResult, Execution
from .local import LocalDaemon
from .tools import Providers, ProviderTools
from .transport import WebSocket, check_token, checked_url


class Limits(TypedDict, total=False):
    """Per-execution limits; the defaults are execbox's."""

    timeout_ms: float
    memory_limit_bytes: int
    max_log_lines: int
    max_log_chars: int


DEFAULT_LIMITS: Final[Limits] = {
    "timeout_ms": 5000,
    "memory_limit_bytes": 64 * 1024 * 1024,
    "max_log_lines": 100,
    "max_log_chars": 64_000,
}
RETRY_BACKOFF_S: Final = 0.25  # the first wait of a retried handshake without Retry-After, doubled each time
MAX_RETRY_WAIT_S: Final = 30.0
DYING_S: Final = 2.0  # how long a private daemon that refuses connections is given to finish exiting
# The handshake header that asks a runner for live logs (runners without them ignore it).
LIVE_LOGS: Final = ((extensions.HEADER, extensions.LIVE_LOGS),)
# The wire's spellings of the limits (``RuntimeOptions``), as a caller may write them by mistake.
_WIRE_NAMES: Final = {
    "timeoutMs": "timeout_ms",
    "memoryLimitBytes": "memory_limit_bytes",
    "maxLogLines": "max_log_lines",
    "maxLogChars": "max_log_chars",
}


class Runner:
    """A remote (``Runner.connect``) or private local (``Runner.local``) execbox runner.

    Use it as a context manager (``async with`` or ``with``): for a local
    runner that starts and stops the daemon; for a remote one it does nothing
    but keeps the code the same.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 10.0,
        retries: int = 0,
    ) -> None:
        if isinstance(connect_timeout, bool) or not isinstance(connect_timeout, int | float) or not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be a number of seconds above 0, not {connect_timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number from 0, not {retries!r}")
        self.url = url
        self.token = token
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.retries = retries
        self._daemon: LocalDaemon | None = None

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        connect_timeout: float = 10.0,
        retries: int = 0,
    ) -> Runner:
        """A runner at ``ws://`` or ``wss://`` URL, authenticated with a bearer ``token``.

        Raises ``ValueError`` at once, saying why, for a URL that is not ``ws://`` or ``wss://`` with
        a host (and a port from 1 to 65535, if any), for a token that is empty or not printable
        ASCII without spaces, for a ``connect_timeout`` that is not a number of seconds above 0 and
        for ``retries`` that is not a whole number from 0. Nothing is connected yet: refusals
        (``Unauthorized``, ``QuotaExceeded``, ``RunnerBusy``) and unreachable runners surface from
        ``execute``. With ``retries``, a handshake refused as busy (503) or over a quota (429) is
        tried again up to that many times, after the runner's ``Retry-After`` (at most
        ``MAX_RETRY_WAIT_S``) or a doubling backoff, as long as that wait ends within the
        execution's ``timeout_ms`` (else the refusal is raised at once); nothing has run when a
        handshake is refused, so a retry never runs code twice.
        """
        checked_url(url)
        check_token(token)
        return cls(url, token=token, ssl_context=ssl_context, connect_timeout=connect_timeout, retries=retries)

    @classmethod
    def local(cls, *, daemon_args: tuple[str, ...] = (), startup_timeout: float = 60.0) -> Runner:
        """A private daemon for this process, started on entering the context and stopped on leaving it,
        and started again by the next execution if it exits in between (killed, crashed).

        ``daemon_args`` are extra ``execbox-runner serve`` flags, for example
        ``("--profile", "hardened")``.
        """
        runner = cls("")
        runner._daemon = LocalDaemon(daemon_args, startup_timeout)
        return runner

    async def execute(
        self,
        code: str,
        providers: Providers | ProviderTools | None = None,
        *,
        on_log: Callable[[str], object] | None = None,
        **limits: Unpack[Limits],
    ) -> ExecuteResult:
        """Run ``code`` with ``providers`` (``{"namespace": {"tool": callable}}``) as guest globals.

        ``on_log`` (a function, or an async one, which is awaited) is called with each line the guest
        logs, once and in order: as the guest writes it on a runner offering live logs, else all at
        the end (the result's ``logs`` has them too).
        An exception it raises cancels the execution and is raised by ``execute`` as it is.

        Returns the result for anything the guest did (including ``timeout``);
        raises a ``RunnerError`` when the runner could not run it. Before anything runs, it raises
        ``TypeError`` for a keyword that is not one of ``Limits``, ``ValueError`` for a limit that
        is not a number in its range, and ``TypeError`` or ``ValueError`` for tools that cannot be described.
        """
        options = _checked_limits("execute", limits)
        observe = None if on_log is None else partial(_log_lines_to, on_log)
        return await self._run(code, Providers.of(providers), options, observe)

    def execute_sync(
        self,
        code: str,
        providers: Providers | ProviderTools | None = None,
        *,
        on_log: Callable[[str], object] | None = None,
        **limits: Unpack[Limits],
    ) -> ExecuteResult:
        """``execute`` for synchronous code (its own event loop; call it from any thread without one).

        Raises ``RuntimeError`` in a thread that runs an event loop (an async function, a notebook),
        saying to ``await runner.execute(...)`` there instead."""
        _checked_limits("execute_sync", limits)
        try:
            running = sniffio.current_async_library()
        except sniffio.AsyncLibraryNotFoundError:
            running = None
        if running is not None:
            raise RuntimeError(
                f"Runner.execute_sync() cannot run in a thread that runs an event loop ({running}: an async "
                "function, a notebook); use `await runner.execute(...)` there"
            )
        return anyio.run(partial(self.execute, code, providers, on_log=on_log, **limits))

    @contextlib.asynccontextmanager
    async def events(
        self, code: str, providers: Providers | ProviderTools | None = None, **limits: Unpack[Limits]
    ) -> AsyncIterator[EventStream]:
        """Run ``code`` as ``execute`` does, showing it as it runs: ``async for event in events``
        gives each ``LogEvent`` and ``ToolCallEvent`` as it happens, then one ``DoneEvent``.

            async with runner.events(code, providers) as events:
                async for event in events: ...

        Leaving the block before the ``DoneEvent`` cancels the execution. A ``RunnerError`` is
        raised by the iteration, where the ``DoneEvent`` would have come; bad limits or tools raise
        on entering the block, as ``execute`` says."""
        options = _checked_limits("events", limits)
        resolved = Providers.of(providers)
        send, receive = anyio.create_memory_object_stream[Event](math.inf)
        stream = EventStream(receive)

        async def run() -> None:
            with send:
                try:
                    send.send_nowait(DoneEvent(await self._run(code, resolved, options, send.send_nowait)))
                except RunnerError as exc:
                    stream.failure = exc

        failure: Exception | None = None
        # The receiving end stays open until the execution has stopped: events it still sends as the
        # block is left (its ``done``, a last line) are dropped, not a ``BrokenResourceError``.
        with receive:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(run)
                try:
                    yield stream
                except Exception as exc:  # raised below, outside the task group, so it is not wrapped in a group
                    failure = exc
                task_group.cancel_scope.cancel()  # the block is left: an execution still running is cancelled
        if failure is not None:
            raise failure

    async def _run(
        self, code: str, resolved: Providers, options: RuntimeOptions, observe: Observer | None
    ) -> ExecuteResult:
        execute = Execute(id=f"exec-{uuid.uuid4().hex}", code=code, options=options, providers=resolved.manifests)
        with tracing.execution_span(execute.id) as trace_headers:
            headers = (*trace_headers, *(LIVE_LOGS if observe is not None else ()))
            websocket = await self._open(headers, anyio.current_time() + options.timeoutMs / 1000)
            result = await Execution(websocket, execute, resolved, observe).run()
            tracing.finished(result.ok, None if result.error is None else result.error.code)
            return result

    async def _open(self, headers: tuple[tuple[str, str], ...], retry_by: float) -> WebSocket:
        """The execution's connection; a busy or over-quota refusal retried as ``retries`` says, if
        the wait ends by ``retry_by`` (the execution's timeout, as the TypeScript client does), and
        a private daemon that has exited started again first (also one found exiting as it refuses
        the connection)."""
        attempt = 0
        restarted = False
        while True:
            endpoint = ("", "")
            try:
                if self._daemon is not None and self.url and self._daemon.exited():
                    self._started(await anyio.to_thread.run_sync(self._daemon.restarted))
                    restarted = True
                endpoint = (self._url(), self.token or "")
                return await WebSocket.open(
                    endpoint[0],
                    token=endpoint[1] or None,
                    ssl_context=self.ssl_context,
                    connect_timeout=self.connect_timeout,
                    headers=headers,
                )
            except RunnerUnavailable:
                daemon = self._daemon
                if daemon is None or restarted:
                    raise
                now = await anyio.to_thread.run_sync(partial(daemon.restarted, endpoint, DYING_S))
                if now == endpoint:  # the same daemon, alive yet unreachable
                    raise
                self._started(now)
                restarted = True
            except (QuotaExceeded, RunnerBusy) as refused:
                wait = min(refused.retry_after or RETRY_BACKOFF_S * 2**attempt, MAX_RETRY_WAIT_S)
                if attempt >= self.retries or anyio.current_time() + wait > retry_by:
                    raise
                await anyio.sleep(wait)
                attempt += 1

    def _url(self) -> str:
        if not self.url:
            raise RuntimeError("start the local runner first: `with Runner.local() as runner:` (or `async with`)")
        return self.url

    def _started(self, endpoint: tuple[str, str]) -> Runner:
        self.url, self.token = endpoint
        return self

    def _stop(self) -> None:
        if self._daemon is not None:
            self._daemon.stop()
            self.url, self.token = "", None

    def __enter__(self) -> Runner:
        return self._started(self._daemon.start()) if self._daemon is not None else self

    def __exit__(self, *exc_info: object) -> None:
        self._stop()

    async def __aenter__(self) -> Runner:
        if self._daemon is None:
            return self
        try:
            return self._started(await anyio.to_thread.run_sync(self._daemon.start))
        except BaseException:  # cancelled while it started: it is running now, so stop it
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self._stop)
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._stop)


class EventStream:
    """The events of one execution (``Runner.events``), as an async iterator."""

    def __init__(self, receive: MemoryObjectReceiveStream[Event]) -> None:
        self._receive = receive
        self.failure: RunnerError | None = None  # why the execution ended without its ``done``

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self._receive.receive()
        except anyio.EndOfStream:
            if self.failure is not None:
                raise self.failure from None
            raise StopAsyncIteration from None


def _log_lines_to(on_log: Callable[[str], object], event: LogEvent | ToolCallEvent) -> object:
    return on_log(event.line) if isinstance(event, LogEvent) else None


def _checked_limits(method: str, limits: Limits) -> RuntimeOptions:
    """The wire's options for ``limits``. Refuse a keyword that is not a limit, as Python does for any
    other function, so that a misspelt limit (or the wire's ``timeoutMs``) is an error rather than a
    default silently kept; and a value that is not one (``ValueError``)."""
    for name in limits:
        if name not in DEFAULT_LIMITS:
            close = _WIRE_NAMES.get(name) or next(iter(difflib.get_close_matches(name, DEFAULT_LIMITS, n=1)), None)
            hint = f"; did you mean {close!r}?" if close else f"; the limits are {', '.join(DEFAULT_LIMITS)}"
            raise TypeError(f"Runner.{method}() got an unexpected keyword argument {name!r}{hint}")
    merged = {**DEFAULT_LIMITS, **limits}
    try:
        return msgspec.convert(
            {
                "timeoutMs": merged["timeout_ms"],
                "memoryLimitBytes": merged["memory_limit_bytes"],
                "maxLogLines": merged["max_log_lines"],
                "maxLogChars": merged["max_log_chars"],
            },
            RuntimeOptions,
        )
    except msgspec.ValidationError as exc:  # "Expected `float` > 0.0 - at `$.timeoutMs`", named as the caller names it
        expected, _, path = str(exc).partition(" - at ")
        name = _WIRE_NAMES.get(path.strip("`").removeprefix("$."), "execution limits")
        raise ValueError(f"invalid {name}: {expected}") from None
