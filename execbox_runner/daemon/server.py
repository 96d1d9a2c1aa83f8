"""The daemon: its listeners give each accepted connection a ``Connection``, served by the reactor.

``Daemon.serve`` starts the worker pool, waits until it is warm, listens,
reports the bound address through ``task_status`` (so tests and the CLI learn
a port 0 choice), and runs until cancelled. ``Daemon.drain`` is the graceful
stop: refuse new sessions, let running executions finish within the grace,
cancel the rest (each still gets its ``done``), close every session.

Connections that have not finished their opening handshake are bounded
(``Handshakes``): a flood of peers that connect and send nothing sheds its own
oldest members, so it can neither exhaust the descriptors nor keep legitimate
hosts waiting in the accept queue.

With ``--metrics-port`` a second listener answers one plain HTTP request per
connection (``/metrics``, the detailed ``/healthz``, ``/readyz``), with the
same TLS, bounds and shedding, and never a session.

Everything on the network runs in one task, the reactor's (``reactor.py``):
accepting, handshakes, sessions, their timers; the worker pool, the memory
sampler and the drain are tasks of the daemon's nursery beside it.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final, Protocol

import trio

from .. import __version__
from ..exposure import is_loopback, read_tokens
from ..worker import native
from .config import Settings
from .connection import Connection
from .machine import cpu_seconds, raise_open_files, resident_bytes, usable_cores
from .net.listeners import Acceptor, Listener, listen
from .net.reactor import Reactor
from .observability import logs, tracing
from .observability.endpoints import ADMIT_MEMORY_SHARE, REFUSAL_SUMMARY_S, DaemonState, Refusals
from .observability.metrics import LiveState, Metrics
from .pool.pool import WorkerPool
from .pool.sharing import Shares
from .report import (
    UNSAFE_SETTINGS,
    accepted_tenants,
    effective_max_sessions,
    host_report,
    memory_budget,
    shares_cpu,
    worker_arguments,
    worker_capacity,
)
from .supervisor import is_shard, shard_count, shard_name
from .tenants import Ledger, Tenant, shares

log = logging.getLogger(__name__)
DRAIN_POLL_S = 0.02
CPU_SAMPLE_INTERVAL_S = 1.0  # how often each tenant's workers' CPU is read (quotas and metrics)
# What a worker gets to finish an execution it was told to abort before it is killed (with its
# other executions): longer than the worker's own interrupting (~2 s), so only a stuck one dies.
ABANDON_GRACE_S = 2.5
# Connections still in their handshake: at most this many, and at most a quarter of the descriptors.
MAX_HANDSHAKES: Final = 1024
LIVE_STATE_INTERVAL_S = 0.5
MEMORY_SAMPLE_INTERVAL_S = 0.1
EVICT_SETTLE_S: Final = 0.5


class Waiting(Protocol):
    """A connection still in its handshake, as the bound sees it."""

    peer: str

    def has_sent(self) -> bool:
        """Whether bytes from the peer wait unread."""

    def abort(self) -> None:
        """Close it now."""


class Handshakes:
    """Connections that have not finished their opening handshake (TLS, then the HTTP
    request), oldest first.

    A legitimate host sends its request at once; a peer that connects and sends nothing
    holds a descriptor until its handshake times out. So when a new connection would
    pass the bound, or the descriptors run out, the oldest silent one is closed: a flood
    of idle connections sheds its own members, and a host behind it gets through. One
    whose bytes have arrived (a burst of hosts the daemon has not read yet) is never shed:
    it leaves the bound instead, as it would once its request is read.
    """

    def __init__(self, limit: int, refusals: Refusals) -> None:
        self._limit = limit
        self._refusals = refusals  # the daemon's refused handshakes: counted and logged
        self._waiting: dict[Waiting, None] = {}  # insertion order: oldest first

    def add(self, connection: Waiting) -> None:
        if len(self._waiting) >= self._limit:
            self.shed()
        self._waiting[connection] = None

    def finished(self, connection: Waiting) -> None:
        self._waiting.pop(connection, None)

    def shed(self) -> bool:
        """Close the oldest connection still in its handshake that has sent nothing; False if
        there is none. Each connection is looked at once: one that has sent bytes leaves the bound."""
        while self._waiting:
            connection = next(iter(self._waiting))
            del self._waiting[connection]
            if connection.has_sent():
                continue
            self._refusals.refuse("shed", connection.peer)
            connection.abort()  # closed now: the descriptor is free for the next accept at once
            return True
        return False


def url(scheme: str, host: str, port: int, path: str = "/") -> str:
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{path}"


def size(count: int) -> str:
    """Bytes for a reader: MiB, or GiB from 1 GiB on."""
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.0f} MiB"


def handshake_limit(open_files: int) -> int:
    """How many connections may wait for their handshake: enough for a burst of hosts, and few
    enough that sessions and workers' channels always have descriptors left."""
    return max(1, min(MAX_HANDSHAKES, open_files // 4))


def closing_time(settings: Settings) -> float:
    """The longest a drain waits, once its grace is over, for the sessions to close: their
    cancelled executions' ``done``, then the hosts' answers to the close frames (and a second
    for the session records to be written)."""
    return settings.cancel_grace + settings.close_timeout + 1


class ConfigurationError(Exception):
    """Settings the daemon refuses to start with."""


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    if not settings.certfile:
        if settings.keyfile:
            raise ConfigurationError("--keyfile needs --certfile")
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        # A passphrase is never asked for: OpenSSL's own prompt would wait on the terminal.
        context.load_cert_chain(settings.certfile, settings.keyfile or None, password=b"")
    except OSError as exc:  # ssl.SSLError is one too
        raise ConfigurationError(_tls_problem(settings.certfile, settings.keyfile, exc)) from None
    return context


def _tls_problem(certfile: str, keyfile: str, exc: OSError) -> str:
    """One line naming the file at fault and what is wrong with it, for OpenSSL's error ``exc``."""
    key = f"--keyfile {keyfile}" if keyfile else f"--certfile {certfile} (no --keyfile)"
    if not isinstance(exc, ssl.SSLError):
        return f"cannot read {exc.filename or certfile}: {exc.strerror or exc}"
    try:
        cert_text = Path(certfile).read_bytes()
        key_text = Path(keyfile).read_bytes() if keyfile else cert_text
    except OSError as error:
        return f"cannot read {error.filename}: {error.strerror}"
    if b"-----BEGIN CERTIFICATE-----" not in cert_text:
        return f"--certfile {certfile} holds no PEM certificate"
    if b"PRIVATE KEY-----" not in key_text:
        return f"{key} holds no PEM private key"
    if b"ENCRYPTED" in key_text:
        return f"the private key of {key} is encrypted: the daemon takes no passphrase"
    if exc.reason == "KEY_VALUES_MISMATCH":
        return f"the private key of {key} does not match the certificate of --certfile {certfile}"
    return f"cannot use --certfile {certfile} with the private key of {key}: {exc.reason or exc}"


def record_directory(settings: Settings, *, create: bool = True) -> Path | None:
    """``--record-dir``, created if missing and tried with a file, so that a directory the daemon
    cannot write (read-only, another user's) stops it at start rather than losing every record.
    Without ``create`` (``info``, which makes nothing), the file is tried in the directory, or in
    its nearest existing parent, where the directory would be made."""
    if not settings.record_dir:
        return None
    directory = Path(settings.record_dir)
    tried = directory if create else next(path for path in (directory, *directory.parents) if path.exists())
    try:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=tried, prefix=".writable-"):
            pass
    except OSError as exc:
        raise ConfigurationError(f"cannot use --record-dir {directory}: {exc.strerror}") from None
    return directory


def tenant_shares(settings: Settings, tenants: tuple[tuple[bytes, Tenant], ...]) -> Shares | None:
    """How the pool shares the machine between the active tenants (``tenants.shares``, by their
    weights): None where tenants do not have workers of their own, or a worker runs one guest."""
    if not tenants or not shares_cpu(settings):
        return None
    weights = {tenant.name: tenant.weight for _, tenant in tenants}
    cores = max(1, usable_cores() // shard_count())
    return lambda names: shares({name: weights.get(name, 1) for name in names}, cores)


def refuse_unauthenticated(settings: Settings, tokens: tuple[bytes, ...]) -> None:
    """Raise ``ConfigurationError`` for a non-loopback address without tokens, unless
    ``--allow-unauthenticated true``: serve's rule, which info applies too, so that it reports
    what serve would do."""
    if not tokens and not is_loopback(settings.host) and not settings.allow_unauthenticated:
        raise ConfigurationError(
            f"refusing to serve {settings.host} without authentication: configure --tokens-file (or --tokens),"
            " or pass --allow-unauthenticated true"
        )


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        tenants = accepted_tenants(settings)
        self.tokens = tuple(token for token, _ in tenants)
        refuse_unauthenticated(settings, self.tokens)
        self.tls = tls_context(settings)
        self.reactor = Reactor()
        self.pool = WorkerPool(
            warm=settings.warm_workers,
            max_workers=settings.max_workers,
            capacity=worker_capacity(settings),
            lifetime=1 if settings.profile == "hardened" else settings.max_executions_per_worker,
            max_output_bytes=settings.max_output_bytes,
            worker_args=worker_arguments(settings),
            abandon_grace=ABANDON_GRACE_S,
            reactor=self.reactor,
            shares=tenant_shares(settings, tenants),
        )
        self.record_dir = record_directory(settings)
        self.report = host_report(settings)
        self.unsafe = self.report["unsafe_settings"]
        self.state = DaemonState(
            max_sessions=effective_max_sessions(settings),
            memory_budget=memory_budget(settings) // shard_count(),
            report=self.report,
            tokens=self.tokens,
            tenant_names=tuple(tenant.name for _, tenant in tenants),
            share_workers=settings.share_workers_across_tokens,
            allowed_origins=frozenset(
                origin.strip() for origin in settings.allowed_origins.split(",") if origin.strip()
            ),
            metrics_tokens=read_tokens(settings.metrics_token, settings.metrics_token_file),
            separate_metrics=bool(settings.metrics_port),
        )
        self.state.metrics = Metrics(self._live_state, known_unsafe=UNSAFE_SETTINGS, unsafe=self.unsafe)
        self.ledger = Ledger(tenant for _, tenant in tenants)  # what each tenant takes, against its quotas
        self.connections: set[Connection] = set()
        self.acceptors: list[Acceptor] = []
        self.records_writing = 0  # session records' writer tasks under way: a drain waits for them
        # Every daemon process raises its own descriptor limit (a supervisor's shards too).
        self.handshakes = Handshakes(handshake_limit(raise_open_files()), self.state.refusals)

    def _live_state(self) -> LiveState:
        pool = self.pool
        return LiveState(
            sessions=self.state.sessions,
            max_sessions=self.state.max_sessions,
            idle_workers=sum(1 for worker in pool.workers if not worker.leases),
            busy_workers=sum(1 for worker in pool.workers if worker.leases),
            starting_workers=pool.starting,
            worker_exits=dict(pool.exit_reasons),
            zygote_renewals=dict(pool.zygote.renewals),
            refused=dict(self.state.refusals.counts),
            draining=self.state.draining,
            memory_used_bytes=self.state.memory_used,
            memory_budget_bytes=self.state.memory_budget,
            log_lines_dropped=logs.dropped_lines(),
        )

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        for warning in self.report["warnings"]:
            log.warning(warning)
        for name in self.unsafe:
            log.warning("unsafe setting %s: %s", name, UNSAFE_SETTINGS[name], extra={"unsafe_setting": name})
        if not native.SUPPORTED:
            log.warning(
                "cannot interrupt running guests with this quickjs build: workers that do not stop in time are killed"
            )
        try:
            async with trio.open_nursery() as nursery:
                await self._serve(nursery, task_status)
        finally:
            if self.state.traces is not None:  # the spans not yet sent
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self.state.traces.shutdown)

    async def _serve(self, nursery: trio.Nursery, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        """The daemon's tasks, in ``nursery``: the reactor, the pool, the listeners."""
        nursery.start_soon(self._run_reactor)  # first: it reads the workers' channels too
        await nursery.start(self.pool.run)
        self.state.pool_ready = True
        self.state.traces = tracing.from_environment()  # after the pool's processes have started
        listeners = await listen(self.settings.host, self.settings.port, reuse_port=is_shard())
        # Shards share the metrics port as they share the sessions' one: any of them answers
        # for all (metrics.py), so the supervisor serves nothing itself.
        scrapers = (
            await listen(
                self.settings.metrics_host or self.settings.host, self.settings.metrics_port, reuse_port=is_shard()
            )
            if self.settings.metrics_port
            else []
        )
        host, port = listeners[0].address
        self._announce(listeners, scrapers)
        self._check_budget_at_rest()
        nursery.start_soon(self._sample_memory)
        nursery.start_soon(self._summarize_refusals)
        if self.tokens and not self.settings.share_workers_across_tokens:
            nursery.start_soon(self._sample_tenant_cpu)
        if self.state.metrics is not None and self.state.metrics.shared_dir is not None:
            nursery.start_soon(self._publish_live_state)
        task_status.started((host, port))
        self.acceptors += [
            Acceptor(self.reactor, listener, self._connector(nursery, scrape=scrape), self._shed)
            for group, scrape in ((listeners, False), (scrapers, True))
            for listener in group
        ]

    def _announce(self, listeners: list[Listener], scrapers: list[Listener]) -> None:
        """The start-up line: where this daemon process serves, within which limits and with
        which protections (with ``--processes``, one line per shard, each with its own share)."""
        settings, state = self.settings, self.state
        secure = self.tls is not None
        sessions = [url("wss" if secure else "ws", *listener.address) for listener in listeners]
        metrics = [url("https" if secure else "http", *listener.address, "/metrics") for listener in scrapers]
        timeouts = {
            "execution": settings.max_timeout_ms / 1000,
            "idle": settings.idle_timeout,
            "handshake": settings.handshake_timeout,
            "send": settings.send_timeout,
            "drain_grace": settings.drain_grace,
        }
        protections = self.report["protections"]
        enforced = [name for name, protection in protections.items() if protection["enforced"]]
        fields: dict[str, object] = {
            "version": __version__,
            "profile": settings.profile,
            "engine": self.report["engine"],
            "shard": shard_name(),
            "listen": sessions,
            "metrics_listen": metrics,
            "authentication": bool(self.tokens),
            "metrics_token": bool(state.metrics_tokens),
            "max_sessions": state.max_sessions,
            "max_workers": self.pool.max_workers,
            "worker_capacity": self.pool.capacity,
            "timeouts_s": timeouts,
            "max_memory_limit_bytes": settings.max_memory_limit_bytes,
            "memory_budget_bytes": state.memory_budget,
            "protections": enforced,
            "unsafe_settings": self.unsafe,
        }
        where = ", ".join(sessions)
        if metrics:
            where += f"; metrics on {', '.join(metrics)}"
        if state.metrics_tokens:
            where += " (metrics token required)"
        log.info(
            "execbox-runner %s (%s%s) serving %s; engine %s; at most %d sessions, %d workers of %d executions each;"
            " executions up to %g s and %s each; idle %g s, handshake %g s, send %g s, drain %g s;"
            " memory budget %s; protections: %s; unsafe: %s",
            __version__,
            settings.profile,
            f", shard {shard_name()}" if shard_name() else "",
            where,
            self.report["engine"],
            state.max_sessions,
            self.pool.max_workers,
            self.pool.capacity,
            timeouts["execution"],
            size(settings.max_memory_limit_bytes),
            settings.idle_timeout,
            settings.handshake_timeout,
            settings.send_timeout,
            settings.drain_grace,
            size(state.memory_budget),
            ", ".join(enforced) or "none",
            ", ".join(self.unsafe) or "none",
            extra=fields,
        )
        logs.flush()  # written before the daemon says where it listens

    async def _run_reactor(self) -> None:
        """The reactor's task: every network socket, and the workers' channels, until cancelled; then
        every connection is closed (an execution still running is abandoned, its worker told to abort)."""
        logs.serving(True)
        try:
            await self.reactor.run()
        finally:
            logs.serving(False)
            for acceptor in self.acceptors:
                acceptor.close()
            for connection in list(self.connections):
                connection.abort()
            self.reactor.close()

    def _connector(self, nursery: trio.Nursery, *, scrape: bool) -> Callable[[socket.socket, str], None]:
        """What to do with a connection a listener accepted: a ``Connection``, counted in the handshake
        bound until its request is in (a scrape too: a flood on the metrics port sheds its own)."""

        def connect(sock: socket.socket, peer: str) -> None:
            connection = Connection(
                self.reactor,
                sock,
                peer,
                pool=self.pool,
                settings=self.settings,
                state=self.state,
                ledger=self.ledger,
                requested=self.handshakes.finished,
                closed=self._closed,
                spawn=functools.partial(self._spawn_record_writer, nursery),
                tls=self.tls,
                record_dir=None if scrape else self.record_dir,
                scrape=scrape,
            )
            self.handshakes.add(connection)
            self.connections.add(connection)
            connection.start()

        return connect

    def _spawn_record_writer(self, nursery: trio.Nursery, write: Callable[[], Awaitable[None]]) -> None:
        """Start a session record's writer, counted from now (a drain that comes before it runs
        still waits for it) to its end."""
        self.records_writing += 1
        nursery.start_soon(self._write_record, write)

    async def _write_record(self, write: Callable[[], Awaitable[None]]) -> None:
        try:
            await write()
        finally:
            self.records_writing -= 1

    def _closed(self, connection: Connection) -> None:
        self.handshakes.finished(connection)
        self.connections.discard(connection)

    def _shed(self, error: OSError) -> bool:
        """Out of descriptors: shed the oldest handshake, so that the next accept succeeds at once
        (True); with none to shed, accepting pauses until a session ends (False)."""
        if self.handshakes.shed():
            return True
        log.warning("cannot accept a connection: %s", error.strerror)
        return False

    def _check_budget_at_rest(self) -> None:
        """A ``WARNING`` when the daemon, its zygote and warm workers already use the share of the
        memory budget at which handshakes are refused, before any session: a budget set below that
        would otherwise refuse every session (503 ``memory``) with the probes all answering ready."""
        used = self.state.memory_used = resident_bytes([os.getpid(), *self.pool.pids])
        budget = self.state.memory_budget
        if used >= budget * ADMIT_MEMORY_SHARE:
            log.warning(
                "memory budget too small: %.1f MiB in use before any session, %d%% of the %.1f MiB budget or more;"
                " every session will be refused (503 memory) until --memory-budget-bytes is raised",
                used / (1 << 20),
                round(ADMIT_MEMORY_SHARE * 100),
                budget / (1 << 20),
                extra={"memory_used_bytes": used, "memory_budget_bytes": budget},
            )

    async def _sample_memory(self) -> None:
        """Keep ``memory_used`` (this daemon, its zygote, its workers) current for admission, and
        keep it within the budget: past it, the execution with the largest heap ends with
        ``memory_limit`` (one at a time, ``EVICT_SETTLE_S`` apart, so that what it freed shows
        before the next is chosen), rather than the kernel's OOM killer ending the daemon."""
        while True:
            used = self.state.memory_used = resident_bytes([os.getpid(), *self.pool.pids])
            if used > self.state.memory_budget:
                evicted = await self.pool.evict_largest()
                if evicted is not None:
                    lease, size = evicted
                    log.warning(
                        "memory budget spent (%d MiB of %d MiB): ending the largest execution (%d MiB, worker %d) with memory_limit",
                        used >> 20,
                        self.state.memory_budget >> 20,
                        size >> 20,
                        lease.worker.pid,
                        extra={"memory_used_bytes": used, "evicted_heap_bytes": size, "worker_pid": lease.worker.pid},
                    )
                    await trio.sleep(EVICT_SETTLE_S)
            await trio.sleep(MEMORY_SAMPLE_INTERVAL_S)

    async def _sample_tenant_cpu(self) -> None:
        """Once a second, what each tenant's workers spent since the last look: for the CPU quotas,
        and ``execbox_tenant_cpu_seconds_total``. A worker's last stretch, since the last look, is
        counted as it exits, from what its zygote learned reaping it, however it ended."""

        def spent(tenant: str, seconds: float) -> None:
            self.ledger.add_cpu(tenant, seconds, self.reactor.now())
            if self.state.metrics is not None:
                self.state.metrics.tenant_cpu.labels(tenant).inc(seconds)

        self.pool.cpu_spent = spent
        while True:
            for worker in list(self.pool.workers):
                total = cpu_seconds(worker.pid)
                if total is not None:
                    self.pool.count_cpu(worker, total)
            await trio.sleep(CPU_SAMPLE_INTERVAL_S)

    async def _summarize_refusals(self) -> None:
        """Once a second, one line per reason for the refusals a flood kept out of the log."""
        try:
            while True:
                await trio.sleep(REFUSAL_SUMMARY_S)
                self.state.refusals.summarize()
        finally:
            self.state.refusals.summarize()  # also those of the last second before a stop

    async def _publish_live_state(self) -> None:
        """Shards: keep this process's live state where every shard's /metrics reads it."""
        assert self.state.metrics is not None
        while True:
            self.state.metrics.publish()
            await trio.sleep(LIVE_STATE_INTERVAL_S)

    async def drain(self) -> None:
        """Stop gracefully: new sessions get 503 (and /readyz fails) at once, and open ones start no
        new execution (each closes with 1001 once idle); running executions have ``drain_grace``
        seconds to finish; then the rest are cancelled (each still gets its ``done``) and every
        session is closed with 1001; the sessions' records are written out (their last lines and
        summaries) before the daemon stops."""
        self.state.draining = True
        for connection in list(self.connections):
            connection.drain()
        with trio.move_on_after(self.settings.drain_grace):
            while any(c.session.execution_id is not None for c in self.connections):
                await trio.sleep(DRAIN_POLL_S)
        for connection in list(self.connections):
            connection.shutdown()
        with trio.move_on_after(closing_time(self.settings)):
            while self.connections or self.records_writing:
                await trio.sleep(DRAIN_POLL_S)
