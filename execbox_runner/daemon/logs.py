"""The daemon's logs: JSON lines (or plain text), one line per execution at least.

Execution lines carry the id, outcome, error code, duration, tool-call count,
peer and the session's correlation id, and the codes of failing tool results
that were outside the stable set (the guest saw them as ``tool_error``). Guest
code is never logged unless the operator asks for it (``--log-guest-code``);
tool inputs and results are never logged.

The correlation id ties a session's lines (and its record) to the host's own
logs: the trace id of the handshake's W3C ``traceparent``, else its
``X-Request-Id``, else a new one. A header that is not well formed is ignored,
so a peer can neither forge an odd-looking id nor flood a line with one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

import msgspec
from websockets.datastructures import Headers

from ..protocol.session import ExecutionEnded

EXECUTIONS: Final = logging.getLogger("execbox_runner.executions")
_STANDARD_FIELDS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# W3C Trace Context: version-traceid-parentid-flags, and more fields after them in later versions.
_TRACEPARENT: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?")
_REQUEST_ID: Final = re.compile(r"[ -~]{1,128}")  # printable ASCII, bounded
_encoder: Final = msgspec.json.Encoder(enc_hook=str)


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object: time, level, logger, message, and any extra fields.

    A line per execution makes this a hot path: the time's seconds are formatted once a
    second, and msgspec encodes (anything else as ``str`` does; text with lone surrogates,
    which UTF-8 cannot hold, escaped by ``json``)."""

    def __init__(self) -> None:
        super().__init__()
        self._second = -1
        self._stamp = ""

    def format(self, record: logging.LogRecord) -> str:
        fields = {key: value for key, value in vars(record).items() if key not in _STANDARD_FIELDS}
        if record.exc_info:
            fields["exception"] = self.formatException(record.exc_info)
        return self.line(record.created, record.levelname.lower(), record.name, record.getMessage(), fields)

    def line(self, created: float, level: str, logger: str, message: str, fields: dict[str, object]) -> str:
        """The line of a record made at ``created`` (``time.time()``) with these extra fields."""
        second = int(created)
        if second != self._second:
            self._second, self._stamp = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        line: dict[str, object] = {
            "time": f"{self._stamp}.{int((created - second) * 1000):03d}Z",
            "level": level,
            "logger": logger,
            "message": message,
        }
        line.update(fields)
        try:
            return _encoder.encode(line).decode()
        except UnicodeEncodeError:  # a lone surrogate (guest code, a host's message): escaped
            return json.dumps(line, default=str, separators=(",", ":"))


class LineWriter(logging.StreamHandler):  # type: ignore[type-arg]
    """The daemon's handler: its lines reach the stream from a thread of their own, so a sink that
    is slow (a busy disk) or stops reading (a full pipe) delays no session.

    While ``defer`` is set (by the server, to its reactor's ``later``), the lines logged on the main
    thread in a reactor pass are handed over together at its end: one wake-up and one write per
    pass, not per execution. At most ``buffer_bytes`` of lines wait for the stream; past that, lines
    are dropped and counted (``dropped``), and where they were missing a WARNING line says how many.
    Outside a reactor (start-up, shutdown) a line is written before ``emit`` returns, waiting at
    most ``drain_s`` for a stream that does not take it; ``flush`` waits likewise."""

    def __init__(self, *, buffer_bytes: int = 4 << 20, drain_s: float = 2.0) -> None:
        super().__init__(sys.stderr)
        self.buffer_bytes, self.drain_s = buffer_bytes, drain_s
        self.defer: Callable[[Callable[[], None]], None] | None = None
        self.dropped = 0
        self._main = threading.get_ident()
        self._batch: list[str] = []  # the main thread's lines of this reactor pass
        self._ready = threading.Condition(threading.Lock())  # guards what follows
        self._queue: list[str | int] = []  # lines, and counts of lines dropped between them
        self._queued_bytes = 0
        self._writing = False
        self._stuck = False  # a flush gave up waiting, and nothing has been written since
        self._thread: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:  # called under ``self.lock``
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._add(text)

    def write_line(self, text: str) -> None:
        """A line made without a LogRecord (see ``execution_ended``)."""
        self.acquire()
        try:
            self._add(text)
        finally:
            self.release()

    def _add(self, text: str) -> None:
        text += self.terminator
        defer = self.defer
        if defer is None:
            self._enqueue([text])
            self.flush()
        elif threading.get_ident() != self._main:
            self._enqueue([text])
        else:
            self._batch.append(text)
            if len(self._batch) == 1:
                defer(self._hand_over)

    def _hand_over(self) -> None:
        """The pass's lines to the writing thread (at the end of a reactor pass: raises nothing)."""
        batch, self._batch = self._batch, []
        if batch:
            self._enqueue(batch)

    def _enqueue(self, lines: list[str]) -> None:
        with self._ready:
            if self._queued_bytes >= self.buffer_bytes:
                self.dropped += len(lines)
                last = self._queue[-1] if self._queue else ""
                if isinstance(last, int):
                    self._queue[-1] = last + len(lines)
                else:
                    self._queue.append(len(lines))
                return
            self._queue.extend(lines)
            self._queued_bytes += sum(map(len, lines))
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_lines, name="log writer", daemon=True)
                self._thread.start()
            self._ready.notify()

    def flush(self) -> None:
        """Hand over what waits (the main thread's pass included), and wait until it is written: for
        ``drain_s`` at most, and not at all while a write that outlasted that wait is still stuck."""
        if threading.get_ident() == self._main:
            self._hand_over()
        with self._ready:
            if not self._stuck:
                written = self._ready.wait_for(lambda: not self._queue and not self._writing, timeout=self.drain_s)
                self._stuck = not written

    def _write_lines(self) -> None:
        """The writing thread: what is queued, in one write each time."""
        while True:
            with self._ready:
                self._ready.wait_for(lambda: self._queue)
                queue, self._queue, self._queued_bytes = self._queue, [], 0
                self._writing = True
            self._write("".join(item if isinstance(item, str) else self._dropped_line(item) for item in queue))
            with self._ready:
                self._writing = self._stuck = False
                self._ready.notify_all()

    def _write(self, text: str) -> None:
        """To the stream's file descriptor where it has one: a write through the stream object would
        hold its lock, and a thread stuck in one at exit is fatal to the interpreter. A stream that
        fails (stderr closed) loses the lines; logging that would come back here."""
        try:
            try:
                fd = self.stream.fileno()
            except (AttributeError, OSError):  # no descriptor (a StringIO)
                self.stream.write(text)
                self.stream.flush()
                return
            data = memoryview(text.encode(getattr(self.stream, "encoding", None) or "utf-8", "backslashreplace"))
            while data:
                data = data[os.write(fd, data) :]
        except Exception:  # noqa: S110 - logging a failure to log would come back here
            pass

    def _dropped_line(self, count: int) -> str:
        record = logging.LogRecord(
            __name__, logging.WARNING, __file__, 0, "%d log lines dropped: the log's reader fell behind", (count,), None
        )
        record.dropped_lines = count
        return self.format(record) + self.terminator


def defer_lines(later: Callable[[Callable[[], None]], None] | None) -> None:
    """Batch the daemon's lines per reactor pass through ``later`` (None: each line written before
    its call returns, and what is pending written now). No-op unless ``configure`` installed the
    daemon's handler."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, LineWriter):
            handler.defer = later
            if later is None:
                handler.flush()


def dropped_lines() -> int:
    """Lines the daemon's handler dropped because the log's reader fell behind."""
    return sum(handler.dropped for handler in logging.getLogger().handlers if isinstance(handler, LineWriter))


def configure(level: str, json_lines: bool) -> None:
    # No line says which thread, process or source line logged it: finding them costs every
    # line a few microseconds (the logging HOWTO's "Optimization").
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # the documented switch for caller lookup
    handler = LineWriter()
    handler.setFormatter(
        JsonFormatter() if json_lines else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("websockets").setLevel(logging.WARNING)


def correlation_id(headers: Headers) -> str:
    """The session's correlation id, from its handshake's headers (see the module docstring)."""
    traceparents = headers.get_all("traceparent")
    if len(traceparents) == 1:
        found = _TRACEPARENT.fullmatch(traceparents[0])
        if (
            found is not None
            and found[1] != "ff"
            and (found[1] != "00" or found[4] is None)
            and found[2].strip("0")
            and found[3].strip("0")
        ):
            return found[2]
    request_ids = headers.get_all("X-Request-Id")
    if len(request_ids) == 1 and _REQUEST_ID.fullmatch(request_ids[0]):
        return request_ids[0]
    return secrets.token_hex(16)


def execution_ended(record: ExecutionEnded, peer: str, correlation: str, code: str | None) -> None:
    """The execution line; ``correlation`` is its session's correlation id; ``code`` is the guest
    code, only when the operator logs it."""
    fields: dict[str, object] = {
        "execution_id": record.id,
        "outcome": record.outcome,
        "error_code": record.code,
        "duration_ms": round(record.duration_s * 1000, 3),
        "tool_calls": record.tool_calls,
        "peer": peer,
        "correlation_id": correlation,
    }
    if record.unknown_tool_codes:
        fields["unknown_tool_error_codes"] = list(record.unknown_tool_codes)
    if code is not None:
        fields["guest_code"] = code
    direct = _direct()
    if direct is None:
        EXECUTIONS.info("execution %s", record.outcome, extra=fields)
    else:
        writer, formatter = direct
        writer.write_line(formatter.line(time.time(), "info", EXECUTIONS.name, f"execution {record.outcome}", fields))


def _direct() -> tuple[LineWriter, JsonFormatter] | None:
    """The daemon's own JSON handler, when it alone would take an execution line (no other handler,
    no filter, the level enabled): the line is then made as its formatter would make it, without
    the logging module's record and dispatch (~8 us less per execution). Anything else that
    listens (another handler, a test's capture) gets the line the ordinary way."""
    root = logging.root
    if len(root.handlers) != 1 or root.filters or EXECUTIONS.handlers or EXECUTIONS.filters or not EXECUTIONS.propagate:
        return None
    writer = root.handlers[0]
    formatter = writer.formatter
    if type(writer) is not LineWriter or writer.filters or type(formatter) is not JsonFormatter:
        return None
    if writer.level > logging.INFO or not EXECUTIONS.isEnabledFor(logging.INFO):
        return None
    return writer, formatter
