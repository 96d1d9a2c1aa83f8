"""One accepted connection: its opening handshake, then WebSocket frames and the session.

The connection is the thin I/O shell around ``Session``: it completes the
handshake (a plain one through ``handshake``'s fast path, whose frames are then
``frames.PlainFrames``; any other through websockets' ``ServerProtocol``, which
keeps its frames), assembles text messages from frames, feeds
the session host messages, worker messages and timer expiries, and performs
the actions the session returns (send to the host, start or message a worker,
release it, close). It is callbacks, not a task: its transport hands it the
host's bytes, the pool its worker's messages, the reactor its timer, and each
performs the session's actions at once; sends never wait (the transport bounds
them in time). Whatever a peer does to its connection (resetting it, stopping
reading, pipelining requests) ends that connection alone, logged at info: it is
never an error of the daemon. A bug in one connection ends that connection alone.

On the metrics port (``scrape``) a connection answers one plain HTTP request
(``endpoints.observe``) and is never a session.
"""

from __future__ import annotations

import logging
import math
import socket
import ssl
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Final, ParamSpec

import msgspec
from websockets.exceptions import InvalidState
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

from ..protocol import extensions, ipc
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
from .config import Settings
from .net import handshake
from .net.fragments import Fragments
from .net.frames import PlainFrames
from .net.reactor import Reactor, Timer
from .net.transport import Transport
from .observability import endpoints, logs, tracing
from .observability.endpoints import DaemonState
from .observability.records import Recorder
from .pool.pool import WorkerPool
from .pool.worker import Lease, WorkerLost
from .tenants import Ledger

log = logging.getLogger(__name__)

CLOSE_NORMAL: Final = 1000
CLOSE_TOO_BIG: Final = 1009
_WEBSOCKETS_LOG: Final = logging.getLogger("websockets.server")  # the logger websockets' server side would look up
_P = ParamSpec("_P")


class Connection:
    # One per session, so slots: from 30 attributes on (CPython 3.11) an instance dict no longer
    # shares its keys with the other sessions' and holds a whole hash table of its own.
    __slots__ = (
        "_close_deadline", "_closed", "_closed_by_us", "_counted", "_ended", "_eof", "_fragments", "_idle_since",
        "_lost_worker", "_memory_held", "_parser", "_quota_refused", "_reactor", "_record_dir", "_replaceable",
        "_requested", "_run",
        "_scrape", "_spawn", "_timer", "_trace_context", "_worker_pid", "correlation_id", "lease", "ledger", "peer",
        "pool", "recorder", "session", "settings", "state", "tenant", "tenant_name", "transport", "ws",
    )  # fmt: skip

    def __init__(
        self,
        reactor: Reactor,
        sock: socket.socket,
        peer: str,
        *,
        pool: WorkerPool,
        settings: Settings,
        state: DaemonState,
        ledger: Ledger,
        requested: Callable[[Connection], None],
        closed: Callable[[Connection], None],
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
        tls: ssl.SSLContext | None = None,
        record_dir: Path | None = None,
        scrape: bool = False,
    ) -> None:
        self.peer = peer
        self.pool = pool
        self.settings = settings
        self.state = state
        self.ledger = ledger
        self._reactor = reactor
        self._requested = requested  # called once the peer's handshake request has arrived
        self._closed = closed  # called once the connection is over
        self._spawn = spawn  # starts a task in the daemon's nursery (a session record's writer)
        self._record_dir = record_dir
        self._scrape = scrape
        self.recorder: Recorder | None = None  # with --record-dir, made at the handshake
        self.correlation_id = ""  # in every log line and the record of the session (set at the handshake)
        self._closed_by_us = False
        self._counted = False  # this connection holds one of the daemon's session places
        self._idle_since: float | None = None  # when the session last had no execution
        # Once the request is in: the fast path's frames (already open), or websockets' ServerProtocol.
        self.ws: PlainFrames | ServerProtocol | None = None
        self._parser: ServerProtocol | None = None  # a handshake that did not take the fast path
        self.session = Session(
            cancel_grace=settings.cancel_grace,
            timeout_grace=settings.timeout_grace,
            max_output_bytes=settings.max_output_bytes,
            max_timeout_ms=settings.max_timeout_ms,
            max_memory_limit_bytes=settings.max_memory_limit_bytes,
            admit=self._admission,
        )
        self.tenant_name = ""  # whose token the session bears (``tenants``; set at the handshake)
        self.tenant = ""  # executions of different tenants never share a worker, unless told to
        self._memory_held = 0  # the running execution's memoryLimitBytes, in its tenant's ledger
        self._quota_refused = False  # the execute being refused is at its tenant's quota (``_admission``)
        self._trace_context: dict[str, str] = {}  # the host's W3C trace context, when traces are on
        self._worker_pid: int | None = None  # the current execution's worker, for its trace
        self._lost_worker = False  # ... and whether it was lost
        self.lease: Lease | None = None
        self._run: ipc.Run | None = None  # a run waiting for room in the pool
        # The execution's run until its worker answers it: placed once more if that worker is lost first.
        self._replaceable: ipc.Run | None = None
        self._eof = False  # our end of data is sent: the TCP connection closes (lingering)
        self._ended = False
        self._fragments: Fragments | None = None  # a text message arriving in pieces
        self._close_deadline = math.inf  # set once the closing handshake starts
        self._timer: Timer | None = None
        self.transport = Transport(reactor, sock, self, send_timeout=settings.send_timeout, tls=tls)
        self._set_timer(self._reactor.now() + settings.handshake_timeout)

    # ------------------------------------------------------------------ entry points

    def _guarded(self, step: Callable[_P, None], *args: _P.args, **kwargs: _P.kwargs) -> None:
        """Run one step of the connection; a bug in it ends this connection, never the caller
        (the reactor, a worker's relay, the drain)."""
        try:
            step(*args, **kwargs)
        except Exception:
            log.exception("connection failed")
            self.transport.abort()
            try:
                self._end()
            except Exception:
                log.exception("connection failed to end")

    def start(self) -> None:
        """Read what the host has sent already (its handshake request, usually): the reactor would
        report it only on its next pass."""
        self._guarded(self.transport.read_now)

    def received(self, data: bytes) -> None:
        self._guarded(self._received, data)

    def ended(self) -> None:
        self._guarded(self._peer_ended)

    def lost(self, reason: str | None) -> None:
        """The connection broke (``reason``): an info line for a session, with its correlation id;
        a connection still in its handshake (anyone's, many a second) is only a debug line."""
        if reason is not None:
            log.log(
                logging.INFO if self._counted else logging.DEBUG,
                "connection from %s lost: %s",
                self.peer,
                reason,
                extra={"correlation_id": self.correlation_id} if self._counted else None,
            )
        self._guarded(self._end)

    def _admission(self, execution_id: str, memory_limit: int) -> str | None:
        """(The session, as an execute arrives.) Why this session's tenant may start no execution of
        ``memory_limit`` bytes now, at one of its quotas (checked at the handshake, and again here: a
        session runs many); or None. A refusal is logged (a few lines a second) and counted by tenant
        and quota."""
        over = self.ledger.refusal(self.tenant_name, self._reactor.now(), opening=False, memory_limit=memory_limit)
        if over is None:
            return None
        quota, wait_s, message = over
        self._quota_refused = True
        self.state.refusals.refuse_execution(execution_id, self.peer, self.correlation_id, self.tenant_name, quota)
        if self.state.metrics is not None:
            self.state.metrics.quota_refused_executions.labels(self.tenant_name, quota).inc()
        return f"{message}: try again in {math.ceil(wait_s)} s (quota {quota})"

    def stalled(self) -> None:
        """The peer read nothing of what was written to it for ``--send-timeout`` seconds: it is dropped."""
        log.warning(
            "dropping the connection from %s: it read nothing for %g s",
            self.peer,
            self.settings.send_timeout,
            extra={"correlation_id": self.correlation_id} if self._counted else None,
        )

    def worker_message(self, lease: Lease, message: ipc.ToolCalls | ipc.Finished) -> None:
        """The worker's message for this connection's execution (from the pool's relay)."""
        self._guarded(self._worker_message, lease, message)

    def worker_lost(self, lease: Lease, reason: WorkerLost) -> None:
        self._guarded(self._worker_lost, lease, reason)

    @property
    def backlog(self) -> int:
        """Bytes sent to the host that it has not taken yet."""
        return self.transport.backlog

    def drain(self) -> None:
        """The daemon drains: this session's running execution may finish, then it closes (at once if
        none runs)."""
        if self._counted:
            self._guarded(self._perform, self.session.drain())

    def shutdown(self) -> None:
        """The daemon is stopping: cancel this session's execution (it gets its done), then close.
        A connection still in its handshake (its request, whole, would get 503) is closed now:
        the drain does not wait for its handshake timeout."""
        if self._counted:  # an open session (counted from its handshake to its end)
            self._guarded(self._perform, self.session.shutdown(self._reactor.now()))
        elif self.ws is None:
            self.abort()

    def has_sent(self) -> bool:
        """Whether the peer's bytes wait unread (for the handshake bound)."""
        return self.transport.has_sent()

    def abort(self) -> None:
        """Close now: a silent handshake shed under a flood, or every connection as the daemon stops."""
        self.transport.abort()
        self._guarded(self._end)

    # ------------------------------------------------------------------ handshake

    def _received(self, data: bytes) -> None:
        if self._ended:
            return
        if self.ws is None:
            self._handshake(data)
            return
        self.ws.receive_data(data)
        self._frames(self.ws.events_received())

    def _peer_ended(self) -> None:
        if self._ended:
            return
        if self.ws is None:  # gone before its request was whole
            self._end()
            return
        self.ws.receive_eof()
        self._frames(self.ws.events_received(), eof=True)

    def _handshake(self, data: bytes) -> None:
        """A plain upgrade request that arrives whole in the first read takes the fast path
        (``handshake``); any other request is websockets' to parse and answer."""
        if self._parser is None:
            upgrade = handshake.parse_upgrade(data)
            if upgrade is not None:
                self.ws = PlainFrames(max_size=self.settings.max_message_bytes, logger=_WEBSOCKETS_LOG)
                self.ws.receive_data(upgrade.rest)
                self._accept(upgrade.request, self.ws.events_received(), upgrade.accept)
                return
            self._parser = ServerProtocol(max_size=self.settings.max_message_bytes)
        parser = self._parser
        parser.receive_data(data)
        events = parser.events_received()
        for index, event in enumerate(events):
            if isinstance(event, Request):
                self.ws = parser
                self._accept(event, events[index + 1 :])
                return
        if parser.close_expected():  # malformed: websockets answered 400
            self.ws = parser
            self._flush()
            self._end()

    def _accept(self, request: Request, after: Sequence[object], accept: str | None = None) -> None:
        """Route the handshake request: answer a probe or a refusal, else open the session.
        ``after``: what the protocol parsed of the bytes that followed the request; ``accept``:
        the fast path's ``Sec-WebSocket-Accept`` (websockets answers the others)."""
        assert self.ws is not None
        self._requested(self)
        if self._scrape:
            self._respond(endpoints.observe(request, self.state))
            return
        answer = endpoints.route(request, self.state, peer=self.peer)
        if answer is None and self.ws.eof_sent:
            answer = endpoints.bad_request("what followed the handshake request is not WebSocket frames")
        if answer is None:
            self.tenant_name = endpoints.tenant(request, self.state)
            if (over := self.ledger.refusal(self.tenant_name, self._reactor.now())) is not None:
                answer = endpoints.over_quota(self.tenant_name, *over, self.state, self.peer)
        if answer is not None:  # health, readiness, or a refused session
            self._respond(answer)
            return
        self.tenant = "" if self.state.share_workers else self.tenant_name
        self.correlation_id = logs.correlation_id(request.headers)
        if self.state.traces is not None:
            self._trace_context = tracing.trace_context(request.headers)
        turned_on = extensions.negotiate(request.headers.get_all(extensions.HEADER))
        if self._record_dir is not None:
            self.recorder = Recorder(self._record_dir, self.peer, self.correlation_id, self._spawn, turned_on)
        self.session.live_logs = extensions.LIVE_LOGS in turned_on
        extra = ((extensions.HEADER, ", ".join(turned_on)),) if turned_on else ()
        if accept is not None:
            self.transport.write(handshake.response(accept, self.correlation_id, extra))
            self._flush()  # the protocol's answers to frames sent with the request (a pong)
        else:
            assert isinstance(self.ws, ServerProtocol)
            response = self.ws.accept(request)
            response.headers["X-Request-Id"] = self.correlation_id  # for the host's own logs
            response.headers.update(extra)
            self.ws.send_response(response)
            # websockets' parser keeps the request for the connection's life: its headers
            # (~2.4 KiB) are of no use past the handshake.
            request.headers.clear()
            self._flush()
        if self.ws.state is not State.OPEN:
            self._end()
            return
        self.state.sessions += 1
        self.ledger.session_opened(self.tenant_name)
        self._counted = True
        self._idle_since = self._reactor.now()
        self._rearm_timer()
        self._frames(after)

    def _respond(self, response: Response) -> None:
        """Answer a request that does not become a session, then end the connection.

        Written here, not by the protocol: the protocol has already parsed whatever the
        peer pipelined after the request (a second probe) as frames, failed on it and
        queued its end of data. The request still gets its answer; nothing after it does.
        """
        assert self.ws is not None
        self.ws.data_to_send()  # discarded: the protocol's reaction to the pipelined bytes
        self._eof = True
        self.transport.write(response.serialize())
        self._end()

    # ------------------------------------------------------------------ frames

    def _frames(self, events: Sequence[object], *, eof: bool = False) -> None:
        """Take the host's frames, then send what the protocol answered (pongs, close replies, the
        close on a protocol error). The connection ends with the peer's end of data, or ours; once
        a close frame has gone either way, the peer gets ``close_timeout`` to finish the handshake."""
        for event in events:
            if isinstance(event, Frame) and not self._ended:  # the handshake is over: nothing else follows
                self._frame(event)
        if self._ended:
            return
        self._flush()
        assert self.ws is not None
        if eof or self._eof or self.ws.state is State.CLOSED:
            self._end()
        elif self.ws.close_expected():  # the host's close frame, answered by the protocol
            self._closing_handshake_began()
            self._rearm_timer()

    def _frame(self, frame: Frame) -> None:
        now = self._reactor.now()
        opcode = frame.opcode
        payload = bytes(frame.data)  # already bytes from the parser: no copy
        if opcode is Opcode.TEXT:
            if frame.fin:
                self._record(lambda recorder: recorder.host_text(payload))
                self._perform(self.session.receive_text(payload, now))
            else:
                self._fragments = Fragments(payload)
        elif opcode is Opcode.CONT and self._fragments is not None:
            self._fragments.add(payload)
            if self._fragments.wire > self.settings.max_message_bytes:
                self._fragments = None
                self._close(CLOSE_TOO_BIG, "message too big, counting the headers of its fragments")
                return
            if frame.fin:
                data, self._fragments = bytes(self._fragments.data), None
                self._record(lambda recorder: recorder.host_text(data))
                self._perform(self.session.receive_text(data, now))
        elif opcode is Opcode.BINARY:
            self._record(lambda recorder: recorder.host_binary(payload))
            self._perform(self.session.receive_binary(now))
        elif opcode is Opcode.CLOSE and not self._closed_by_us:
            self._record(Recorder.host_close)
        # PING, PONG and CLOSE are answered by the protocol itself.

    # ------------------------------------------------------------------ actions

    def _perform(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case SendToHost(data=data):
                    self._send_text(data)
                case StartRun(run=run):
                    self._start_run(run)
                case SendToWorker(message=message):
                    self._to_worker(message)
                case ReleaseWorker(misbehaved=misbehaved):
                    self._release(misbehaved)
                case CloseTransport(code=code, reason=reason):
                    self._close(code, reason)
                case ExecutionEnded():
                    self._observe(action)
        if self.session.execution_id is None:
            if self._idle_since is None and self.session.phase is not Phase.CLOSED:
                self._idle_since = self._reactor.now()
        else:
            self._idle_since = None
        self._rearm_timer()

    def _observe(self, record: ExecutionEnded) -> None:
        """Count, log and trace an execution that ended, or an execute refused before it started.
        One refused while another execution runs leaves that one's memory in the tenant's ledger
        and its worker in its trace. One refused at its tenant's quota is counted by
        ``execbox_quota_refused_executions_total`` alone: its ``internal_error`` is not the runner's
        fault, which that code counts in ``execbox_executions_total`` (and alerts on)."""
        ran = self.session.execution_id is None  # else the record is of an execute refused meanwhile
        if ran:
            self.ledger.execution_ended(self.tenant_name, self._memory_held)
            self._memory_held = 0
        if self.recorder is not None:
            self.recorder.execution_ended(record)
        quota_refused, self._quota_refused = self._quota_refused, False
        if self.state.metrics is not None and not quota_refused:
            self.state.metrics.execution_ended(record, self.tenant_name)
        logs.execution_ended(
            record,
            self.peer,
            self.correlation_id,
            record.guest_code if self.settings.log_guest_code else None,
            self.tenant_name,
        )
        if self.state.traces is not None:
            self.state.traces.record(
                record,
                trace_context=self._trace_context,
                tenant=self.tenant_name,
                worker_pid=self._worker_pid if ran else None,
                worker_lost=self._lost_worker and ran,
            )
        if ran:
            self._worker_pid, self._lost_worker = None, False

    def _record(self, step: Callable[[Recorder], None]) -> None:
        """With --record-dir: record one step, written to disk in order by the record's writer."""
        if self.recorder is not None:
            step(self.recorder)
            self.recorder.flush()

    def _send_text(self, data: bytes) -> None:
        assert self.ws is not None
        try:
            self.ws.send_text(data)
        except InvalidState:
            return  # closing: nothing more can be sent
        self._record(lambda recorder: recorder.runner(data))
        self._flush()

    def _close(self, code: int, reason: str) -> None:
        assert self.ws is not None
        try:
            self.ws.send_close(code, reason)
        except InvalidState:
            return
        self._closed_by_us = True
        self._record(lambda recorder: recorder.runner_close(code))
        self._flush()
        self._closing_handshake_began()

    def _closing_handshake_began(self) -> None:
        """A close frame has gone, either way: the host has ``close_timeout`` to finish the handshake."""
        if self._close_deadline == math.inf:
            self._close_deadline = self._reactor.now() + self.settings.close_timeout

    def _flush(self) -> None:
        """Send what the protocol has queued (the transport bounds it in time)."""
        assert self.ws is not None
        chunks = self.ws.data_to_send()
        if not chunks:
            return
        if not chunks[-1]:
            self._eof = True  # end of data: the connection closes once the host's frames are taken
        self.transport.write(b"".join(chunks))

    # ------------------------------------------------------------------ worker

    def _start_run(self, run: ipc.Run) -> None:
        """Lease a slot in a worker (now, or once there is room) and send it the run."""
        self._memory_held = run.memory_limit
        self.ledger.execution_started(self.tenant_name, run.memory_limit, self._reactor.now())
        self._run = self._replaceable = run
        self.pool.acquire(self.tenant, self._leased)

    def _leased(self, lease: Lease) -> None:
        self._guarded(self._send_run, lease)

    def _send_run(self, lease: Lease) -> None:
        run, self._run = self._run, None
        assert run is not None
        self.lease = lease
        self._worker_pid = lease.worker.pid
        lease.receiver = self
        lease.send(self._left_of(run))

    def _worker_message(self, lease: Lease, message: ipc.ToolCalls | ipc.Finished) -> None:
        if self.lease is not lease:
            # The session let the slot go (and may run the next execution) while this message
            # was on its way: it is not the session's any more.
            return
        self._replaceable = None
        now = self._reactor.now()
        if isinstance(message, ipc.ToolCalls):
            self._perform(self.session.worker_tool_calls(message, now))
        else:
            self._perform(self.session.worker_finished(message, now))

    def _worker_lost(self, lease: Lease, reason: WorkerLost) -> None:
        """The execution's worker is gone. If it never answered the run, nothing of the execution
        reached the host (no tool call, no log line): it is placed on another worker, once (a
        guest that kills its worker does not get to kill them all). Otherwise it ends here."""
        if self.lease is not lease:
            return
        run, self._replaceable = self._replaceable, None
        if run is None or lease.answered or self.session.phase is not Phase.RUNNING:
            self._lost_worker = True
            self._perform(self.session.worker_lost(self._reactor.now(), str(reason)))
            return
        log.info(
            "execution %s: worker %d was lost before it answered (%s); placing it on another worker",
            logs.clipped(self.session.execution_id or ""),
            lease.worker.pid,
            reason,
            extra={"correlation_id": self.correlation_id, "worker_pid": lease.worker.pid},
        )
        self._release(misbehaved=False)
        self._run = run
        self.pool.acquire(self.tenant, self._leased)

    def _left_of(self, run: ipc.Run) -> ipc.Run:
        """``run`` with the time left of its budget now: a wait for room in the pool counts, so the
        worker's own deadline (from the run's arrival) falls with the session's."""
        deadline = self.session.deadline
        if deadline is None:
            return run
        return msgspec.structs.replace(run, budget_s=max(0.0, deadline - self._reactor.now()))

    def _to_worker(self, message: ipc.Settle | ipc.Abort) -> None:
        lease = self.lease
        if lease is None:
            # Aborted before a slot was leased: stop waiting for one.
            self._stop_waiting()
            self._perform(self.session.worker_lost(self._reactor.now(), "no worker"))
            return
        lease.send(message)

    def _release(self, misbehaved: bool) -> None:
        self._stop_waiting()
        self._replaceable = None
        lease, self.lease = self.lease, None
        if lease is not None:
            self.pool.release(lease, misbehaved=misbehaved)

    def _stop_waiting(self) -> None:
        if self._run is not None:
            self._run = None
            self.pool.withdraw(self._leased)

    # ------------------------------------------------------------------ timer and end

    def _deadline(self) -> float:
        """The session's next deadline, or when an idle session times out."""
        deadline = self.session.deadline
        if deadline is not None:
            return deadline
        if self._idle_since is not None:
            return self._idle_since + self.settings.idle_timeout
        return math.inf

    def _rearm_timer(self) -> None:
        if not self._ended:
            self._set_timer(min(self._deadline(), self._close_deadline))

    def _set_timer(self, deadline: float) -> None:
        """Have ``_expire`` run by ``deadline``. A timer due sooner is kept, and ``_expire`` finds
        nothing due then and re-arms: a session's deadline mostly moves later (the handshake's
        bound, then the execution's, then the next idle period), and keeping costs less than
        replacing."""
        timer = self._timer
        if timer is not None:
            if timer.deadline <= deadline:
                return
            timer.cancel()
        self._timer = None if deadline == math.inf else self._reactor.call_at(deadline, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        self._guarded(self._expire)

    def _expire(self) -> None:
        if self._ended:
            return
        now = self._reactor.now()
        if not self._counted or now >= self._close_deadline:
            self._end()  # the handshake, or the closing handshake, took too long
            return
        if self._idle_since is not None and now >= self._idle_since + self.settings.idle_timeout:
            self._idle_since = None
            self._close(CLOSE_NORMAL, f"no execute within {self.settings.idle_timeout:g} s")
            self._rearm_timer()
            return
        self._perform(self.session.timer(now))

    def _end(self) -> None:
        """The connection is over: the session learns (an execution still running is abandoned), the
        socket closes once what was sent has gone, lingering after a closing handshake."""
        if self._ended:
            return
        self._ended = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._counted:
            self._counted = False
            self.state.sessions -= 1
            self.ledger.session_closed(self.tenant_name)
        for action in self.session.transport_closed(self._reactor.now()):
            match action:
                case ReleaseWorker(misbehaved=misbehaved):
                    self._release(misbehaved)
                case ExecutionEnded():
                    self._observe(action)
        self.transport.close(self.settings.close_timeout if self._eof else None)
        if self.recorder is not None:
            self.recorder.close()
        self._closed(self)
