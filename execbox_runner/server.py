"""The daemon: a trio TCP listener that gives each connection a ``Connection``.

``serve`` starts the worker pool, waits until it is warm, listens, reports the
bound address through ``task_status`` (so tests and the CLI learn a port 0
choice), and runs until cancelled.
"""

from __future__ import annotations

import logging

import trio

from . import native, sandbox
from .config import Settings
from .connection import Connection, ConnectionLimits
from .pool import WorkerPool

log = logging.getLogger(__name__)


def worker_arguments(settings: Settings) -> list[str]:
    args = ["--max-memory", str(settings.max_memory_limit_bytes), "--max-timeout", str(settings.max_timeout_ms / 1000), "--max-output", str(settings.max_output_bytes)]
    return args if settings.sandbox else [*args, "--no-sandbox"]


async def serve(settings: Settings, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
    for warning in sandbox.warnings(sandbox.enforcement(settings.sandbox)):
        log.warning(warning)
    if not native.SUPPORTED:
        log.warning("cannot interrupt running guests with this quickjs build: workers that do not stop in time are killed")
    pool = WorkerPool(
        warm=settings.warm_workers,
        max_workers=settings.max_workers,
        # The hardened profile never runs two executions in one process.
        max_executions=1 if settings.profile == "hardened" else settings.max_executions_per_worker,
        max_frame=2 * settings.max_output_bytes + (1 << 20),
        worker_args=worker_arguments(settings),
    )
    limits = ConnectionLimits(
        max_message_bytes=settings.max_message_bytes,
        send_timeout_s=settings.send_timeout,
        handshake_timeout_s=settings.handshake_timeout,
        close_timeout_s=settings.close_timeout,
        cancel_grace_s=settings.cancel_grace,
        timeout_grace_s=settings.timeout_grace,
        max_output_bytes=settings.max_output_bytes,
        max_timeout_ms=settings.max_timeout_ms,
        max_memory_limit_bytes=settings.max_memory_limit_bytes,
    )

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await Connection(stream, pool, limits).serve()
        except Exception:
            # A bug in one connection must never take the daemon down.
            log.exception("connection failed")

    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        listeners = await trio.open_tcp_listeners(settings.port, host=settings.host)
        for listener in listeners:
            listener.socket.setsockopt(trio.socket.IPPROTO_TCP, trio.socket.TCP_NODELAY, 1)
        host, port = listeners[0].socket.getsockname()[:2]
        task_status.started((host, port))
        await trio.serve_listeners(handle, listeners, handler_nursery=nursery)
