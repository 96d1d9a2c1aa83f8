"""One WebSocket connection: websockets' Sans-I/O protocol over a trio stream.

The connection is the thin I/O shell around ``Session``: it completes the
handshake (a plain one through ``handshake``'s fast path, any other through
websockets' ``ServerProtocol``), assembles text messages from frames, feeds
the session host messages, worker messages and timer expiries, and performs
the actions the session returns (send to the host, start or message a worker,
release it, close). Every send to the host is bounded in time, so a peer that stops
reading cannot hold anything else up. Whatever a peer does to its connection
(resetting it, stopping reading, pipelining requests) ends that connection
alone, logged at info: it is never an error of the daemon.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import msgspec
import trio
from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Protocol, Side, State
from websockets.server import ServerProtocol

from ..protocol import ipc
from ..protocol.session import (
    Action,
    CloseTransport,
    ExecutionEnded,
    Phase,
    ReleaseWorker,
    SendToHost,
    SendToWorker,
    Session,
    StartRun,
)
from . import endpoints, handshake, logs
from .config import Settings
from .endpoints import DaemonState
from .pool import Lease, WorkerLost, WorkerPool
from .records import Recorder
from .streams import await_data, close, nothing_unread, write_whole

log = logging.getLogger(__name__)

RECEIVE_BYTES: Final = 65536
CLOSE_NORMAL: Final = 1000


class Connection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        pool: WorkerPool,
        settings: Settings,
        state: DaemonState,
        requested: Callable[[], None],
        peer: str = "",
        record_dir: Path | None = None,
    ) -> None:
        self.stream = stream
        self.peer = peer
        self._requested = requested  # called once the peer's handshake request has arrived
        self._record_dir = record_dir
        self.recorder: Recorder | None = None  # with --record-dir, made at the handshake
        self.correlation_id = ""  # in every log line and the record of the session (set at the handshake)
        self._closed_by_us = False
        self.pool = pool
        self.settings = settings
        self.state = state
        self._counted = False  # this connection holds one of the daemon's session places
        self._idle_since: float | None = None  # when the session last had no execution
        self.ws: Protocol  # made by the handshake: websockets' ServerProtocol, or a Protocol already open
        self.session = Session(
            cancel_grace=settings.cancel_grace,
            timeout_grace=settings.timeout_grace,
            max_output_bytes=settings.max_output_bytes,
            max_timeout_ms=settings.max_timeout_ms,
            max_memory_limit_bytes=settings.max_memory_limit_bytes,
        )
        self.tenant = ""  # executions of different tenants never share a worker (set at the handshake)
        self.lease: Lease | None = None
        self._send_lock = trio.Lock()
        self._eof = False
        self._fragments: list[bytes] | None = None  # a text message arriving in pieces
        self._execution_scope: trio.CancelScope | None = None
        self._execution_task: trio.lowlevel.Task | None = None
        self._timer_scope: trio.CancelScope | None = None  # the read loop's wait
        self._close_deadline = float("inf")  # set once the closing handshake starts
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------------ lifecycle

    async def serve(self) -> None:
        try:
            early: list[Frame] | None = None
            with trio.move_on_after(self.settings.handshake_timeout):
                early = await self._handshake()
            if early is None or self.ws.state is not State.OPEN:
                return
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                if self.state.draining:  # the drain began while this handshake was answered
                    self.shutdown()
                for frame in early:
                    await self._frame(frame)
                await self._read_loop()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, OSError) as group:
            log.info("connection from %s lost: %s", self.peer, _cause(group))
        except* trio.ClosedResourceError:
            pass  # closed by us: a peer dropped for not reading, or a shed handshake
        finally:
            self._nursery = None
            if self._counted:
                self.state.sessions -= 1
            with trio.CancelScope(shield=True):
                self._perform_sync(self.session.transport_closed(trio.current_time()))
                await self._linger()
                await close(self.stream)
                if self.recorder is not None:
                    await self.recorder.close()

    async def _linger(self) -> None:
        """Close like a lingering TCP close: stop sending, then read and discard what the
        peer still sends (bounded by close_timeout). Closing a socket that has unread data
        resets the connection, and the reset can overtake our close frame. TLS has no
        half-close: its peers wait for us to close first, so there is nothing to linger for.
        Nor is there when nothing is unread, the common case after a closing handshake."""
        if not self._eof or not isinstance(self.stream, trio.SocketStream) or nothing_unread(self.stream):
            return
        with trio.move_on_after(self.settings.close_timeout):
            try:
                await self.stream.send_eof()
                while await await_data(self.stream, RECEIVE_BYTES):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    async def _handshake(self) -> list[Frame] | None:
        """Answer the opening handshake; the frames that came with it, or None if it failed.

        A plain upgrade request that arrives whole takes the fast path (``handshake``); any
        other request is websockets' to parse and answer."""
        data = await await_data(self.stream, RECEIVE_BYTES, just_scheduled=True)
        if not data:
            return None
        upgrade = handshake.parse_upgrade(data)
        if upgrade is not None:
            return await self._upgrade(upgrade)
        self.ws = ServerProtocol(max_size=self.settings.max_message_bytes)
        while True:
            self.ws.receive_data(data)
            events = self.ws.events_received()
            for index, event in enumerate(events):
                if isinstance(event, Request):
                    return await self._accept(event, events[index + 1 :])
            if self.ws.close_expected():  # malformed handshake: websockets answered 400
                await self._flush()
                return None
            data = await await_data(self.stream, RECEIVE_BYTES)
            if not data:
                return None

    async def _upgrade(self, upgrade: handshake.Upgrade) -> list[Frame] | None:
        """The fast path: the session's protocol starts open, fed what followed the request."""
        self.ws = Protocol(Side.SERVER, max_size=self.settings.max_message_bytes)
        self.ws.receive_data(upgrade.rest)
        return await self._accept(upgrade.request, self.ws.events_received(), upgrade.accept)

    async def _accept(self, request: Request, after: Sequence[object], accept: str | None = None) -> list[Frame] | None:
        """Route the handshake request: answer a probe or a refusal, else open the session.
        ``after``: what the protocol parsed of the bytes that followed the request; ``accept``:
        the fast path's ``Sec-WebSocket-Accept`` (websockets answers the others)."""
        self._requested()
        answer = endpoints.route(request, self.state, peer=self.peer)
        if answer is None and self.ws.eof_sent:
            answer = endpoints.bad_request("what followed the handshake request is not WebSocket frames")
        if answer is not None:  # health, readiness, or a refused session
            await self._respond(answer)
            return None
        self.tenant = endpoints.tenant(request, self.state)
        self.correlation_id = logs.correlation_id(request.headers)
        if self._record_dir is not None:
            self.recorder = Recorder(self._record_dir, self.peer, self.correlation_id)
        if accept is not None:
            await self._write(handshake.response(accept, self.correlation_id))
            await self._flush()  # the protocol's answers to frames sent with the request (a pong)
        else:
            assert isinstance(self.ws, ServerProtocol)
            response = self.ws.accept(request)
            response.headers["X-Request-Id"] = self.correlation_id  # for the host's own logs
            self.ws.send_response(response)
            # websockets' parser keeps the request for the connection's life: its headers
            # (~2.4 KiB) are of no use past the handshake.
            request.headers.clear()
            await self._flush()
        if self.ws.state is State.OPEN:
            self.state.sessions += 1
            self._counted = True
            self._idle_since = trio.current_time()
        return [event for event in after if isinstance(event, Frame)]

    async def _respond(self, response: Response) -> None:
        """Answer a request that does not become a session, then end the connection.

        Written here, not by the protocol: the protocol has already parsed whatever the
        peer pipelined after the request (a second probe) as frames, failed on it and
        queued its end of data. The request still gets its answer; nothing after it does.
        """
        self.ws.data_to_send()  # discarded: the protocol's reaction to the pipelined bytes
        self._eof = True
        await self._write(response.serialize())

    async def _read_loop(self) -> None:
        """Read frames until the closing handshake is over (or the peer vanishes).

        The wait for data also keeps the session's timer: its deadline is the
        session's, and ``_rearm_timer`` moves it whenever the session's moves.
        Once a close frame has gone either way, the peer gets ``close_timeout``
        to finish the handshake; the protocol's end-of-data marker means it is
        done and the TCP connection can close.
        """
        while not self._eof:
            with trio.CancelScope(deadline=min(self._deadline(), self._close_deadline)) as scope:
                self._timer_scope = scope
                data = await await_data(self.stream, RECEIVE_BYTES)
            self._timer_scope = None
            if scope.cancelled_caught:
                now = trio.current_time()
                if now >= self._close_deadline:
                    return
                if self._idle_since is not None and now >= self._idle_since + self.settings.idle_timeout:
                    self._idle_since = None
                    await self._close(CLOSE_NORMAL, f"no execute within {self.settings.idle_timeout:g} s")
                    self._close_deadline = now + self.settings.close_timeout
                    continue
                await self._perform(self.session.timer(now))
                continue
            if data:
                self.ws.receive_data(data)
            else:
                self.ws.receive_eof()
            for event in self.ws.events_received():
                if isinstance(event, Frame):  # the handshake is over: nothing else follows
                    await self._frame(event)
            await self._flush()  # pongs, close replies, close on protocol errors
            if not data or self.ws.state is State.CLOSED:
                return
            if self.ws.close_expected() and self._close_deadline == float("inf"):
                self._close_deadline = trio.current_time() + self.settings.close_timeout

    async def _frame(self, frame: Frame) -> None:
        now = trio.current_time()
        opcode = frame.opcode
        payload = bytes(frame.data)  # already bytes from the parser: no copy
        if opcode is Opcode.TEXT:
            if frame.fin:
                await self._record(lambda recorder: recorder.host_text(payload))
                await self._perform(self.session.receive_text(payload, now))
            else:
                self._fragments = [payload]
        elif opcode is Opcode.CONT and self._fragments is not None:
            self._fragments.append(payload)
            if frame.fin:
                data, self._fragments = b"".join(self._fragments), None
                await self._record(lambda recorder: recorder.host_text(data))
                await self._perform(self.session.receive_text(data, now))
        elif opcode is Opcode.BINARY:
            await self._record(lambda recorder: recorder.host_binary(payload))
            await self._perform(self.session.receive_binary(now))
        elif opcode is Opcode.CLOSE and not self._closed_by_us:
            await self._record(Recorder.host_close)
        # PING, PONG and CLOSE are answered by the protocol itself.

    # ------------------------------------------------------------------ actions

    async def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, SendToHost):
                await self._send_text(action.data)
            elif isinstance(action, StartRun):
                assert self._nursery is not None
                self._nursery.start_soon(self._execution, action.run)
            elif isinstance(action, SendToWorker):
                await self._to_worker(action.message)
            elif isinstance(action, ReleaseWorker):
                self._release(action.misbehaved)
            elif isinstance(action, CloseTransport):
                await self._close(action.code, action.reason)
            elif isinstance(action, ExecutionEnded):
                self._observe(action)
        if self.session.execution_id is None:
            if self._idle_since is None and self.session.phase is not Phase.CLOSED:
                self._idle_since = trio.current_time()
        else:
            self._idle_since = None
        self._rearm_timer()

    def shutdown(self) -> None:
        """The daemon is stopping: cancel this session's execution (it gets its done), then close.

        Performed by a task of this connection, not the caller's: a peer that stopped
        reading then costs its own connection (dropped after the send timeout), never
        the drain nor the other sessions' ``done`` and close.
        """
        if self._nursery is not None:
            self._nursery.start_soon(self._shut_down)

    async def _shut_down(self) -> None:
        await self._perform(self.session.shutdown(trio.current_time()))

    def _perform_sync(self, actions: list[Action]) -> None:
        """Actions that need no I/O (used once the transport is gone)."""
        for action in actions:
            if isinstance(action, ReleaseWorker):
                self._release(action.misbehaved)
            elif isinstance(action, ExecutionEnded):
                self._observe(action)

    def _observe(self, record: ExecutionEnded) -> None:
        if self.recorder is not None:
            self.recorder.execution_ended(record)
        if self.state.metrics is not None:
            self.state.metrics.execution_ended(record)
        logs.execution_ended(
            record, self.peer, self.correlation_id, record.guest_code if self.settings.log_guest_code else None
        )

    async def _record(self, step: Callable[[Recorder], None]) -> None:
        """With --record-dir: record one step and put it on disk before the session moves on."""
        if self.recorder is not None:
            step(self.recorder)
            await self.recorder.flush()

    async def _send_text(self, data: bytes) -> None:
        try:
            self.ws.send_text(data)
        except InvalidState:
            return  # closing: nothing more can be sent
        await self._record(lambda recorder: recorder.runner(data))
        await self._flush()

    async def _close(self, code: int, reason: str) -> None:
        try:
            self.ws.send_close(code, reason)
        except InvalidState:
            return
        self._closed_by_us = True
        await self._record(lambda recorder: recorder.runner_close(code))
        await self._flush()

    async def _flush(self) -> None:
        """Write what the protocol has queued, within the send timeout, or drop the peer."""
        chunks = self.ws.data_to_send()
        if not chunks:
            return
        if not chunks[-1]:
            self._eof = True  # end of data: serve() closes the socket
        await self._write(b"".join(chunks))

    async def _write(self, data: bytes) -> None:
        """Write ``data`` whole: it has left the protocol's buffer, so a write cut short by the
        caller's cancellation would lose a frame (a ``done``) or garble the stream. Bounded by the
        send timeout instead, past which the peer is dropped."""
        if data and not await write_whole(self.stream, self._send_lock, data, self.settings.send_timeout):
            log.warning("dropping a peer that stopped reading")
            await self.stream.aclose()
            raise trio.ClosedResourceError("send timed out")

    # ------------------------------------------------------------------ worker

    async def _execution(self, run: ipc.Run) -> None:
        """Lease a slot in a worker, send it the run and relay its messages until it finishes."""
        lease: Lease | None = None
        with trio.CancelScope() as scope:
            self._execution_scope = scope
            self._execution_task = trio.lowlevel.current_task()
            try:
                lease = self.lease = await self.pool.acquire(self.tenant)
                await lease.send(self._left_of(run))
                del run  # the relay waits as long as the execution is parked: it keeps no more than it needs
                while self.lease is lease:  # until the session lets the slot go
                    await self._relay(lease, await lease.receive())
            except WorkerLost as exc:
                if self.lease is lease:
                    await self._perform(self.session.worker_lost(trio.current_time(), str(exc)))
            finally:
                if scope.cancel_called and lease is not None and self.lease is lease:
                    # Cancelled between leasing the slot and the session letting it go.
                    self.lease = None
                    self.pool.release(lease)

    async def _relay(self, lease: Lease, message: ipc.ToolCalls | ipc.Finished) -> None:
        """Give the session a worker message (a method, so that nothing keeps it while the relay
        waits for the next)."""
        if self.lease is not lease:
            # The session let the slot go (and may run the next execution) while this message
            # was on its way: it is not the session's any more.
            return
        now = trio.current_time()
        if isinstance(message, ipc.ToolCalls):
            await self._perform(self.session.worker_tool_calls(message, now))
        elif isinstance(message, ipc.Finished):
            await self._perform(self.session.worker_finished(message, now))

    def _left_of(self, run: ipc.Run) -> ipc.Run:
        """``run`` with the time left of its budget now: a wait for room in the pool counts, so the
        worker's own deadline (from the run's arrival) falls with the session's."""
        deadline = self.session.deadline
        if deadline is None:
            return run
        return msgspec.structs.replace(run, budget_s=max(0.0, deadline - trio.current_time()))

    async def _to_worker(self, message: ipc.Settle | ipc.Abort) -> None:
        lease = self.lease
        if lease is None:
            # Aborted before a slot was leased: stop waiting for one.
            if self._execution_scope is not None:
                self._execution_scope.cancel()
            await self._perform(self.session.worker_lost(trio.current_time(), "no worker"))
            return
        try:
            await lease.send(message)  # bounded by the worker channel's own send timeout
        except WorkerLost:
            pass  # its reader sees the loss and reports it

    def _release(self, misbehaved: bool) -> None:
        lease, self.lease = self.lease, None
        # Another task (timer, host frame) stops the relay; the relay itself just
        # returns after finishing its own actions, which must not be cut short.
        if self._execution_scope is not None and trio.lowlevel.current_task() is not self._execution_task:
            self._execution_scope.cancel()
        self._execution_scope = None
        if lease is not None:
            self.pool.release(lease, misbehaved=misbehaved)

    # ------------------------------------------------------------------ timer

    def _deadline(self) -> float:
        """The session's next deadline, or when an idle session times out."""
        deadline = self.session.deadline
        if deadline is not None:
            return deadline
        if self._idle_since is not None:
            return self._idle_since + self.settings.idle_timeout
        return float("inf")

    def _rearm_timer(self) -> None:
        if self._timer_scope is not None:
            self._timer_scope.deadline = min(self._deadline(), self._close_deadline)


def _cause(group: BaseExceptionGroup[BaseException]) -> str:
    """What ended a lost connection, in a few words (for its info line)."""
    error: BaseException = group.exceptions[0]
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    cause = error.__cause__ or error
    return str(cause) or type(cause).__name__
