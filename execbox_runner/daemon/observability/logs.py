"""The daemon's logs: JSON lines (or plain text), one line per execution at least.

Execution lines carry the id, outcome, error code, duration, tool-call count,
peer and the session's correlation id, and the codes of failing tool results
that were outside the stable set (the guest saw them as ``tool_error``): as
fields of the JSON object, or as ``key=value`` after the message in text mode. Guest
code is never logged unless the operator asks for it (``--log-guest-code``);
tool inputs and results are never logged.

The correlation id ties a session's lines (and its record) to the host's own
logs: the trace id of the handshake's W3C ``traceparent``, else its
``X-Request-Id``, else a new one. A header that is not well formed is ignored,
so a peer can neither forge an odd-looking id nor flood a line with one. What a
host names (an execution's id, a failing tool result's code) is logged ``clipped``.

The lines reach stderr from a thread of their own (``LineWriter``), bounded, so
that a slow or stalled log reader delays no session.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import select
import stat
import sys
import threading
import time
from collections.abc import Iterator
from typing import Final

import msgspec
from websockets.datastructures import Headers

from ...protocol.session import ExecutionEnded

EXECUTIONS: Final = logging.getLogger("execbox_runner.executions")
_STANDARD_FIELDS: Final = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
# W3C Trace Context: version-traceid-parentid-flags, and more fields after them in later versions.
_TRACEPARENT: Final = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-.*)?")
_REQUEST_ID: Final = re.compile(r"[ -~]{1,128}")  # printable ASCII, bounded
_BARE_VALUE: Final = re.compile(r"[!#-<>-~]+")  # printable ASCII but space, quote and =: unquoted in text lines
# Line breaks and other control characters: escaped in a text line's message, as JSON escapes them.
_CONTROLS: Final = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]")
_encoder: Final = msgspec.json.Encoder(enc_hook=str)
# The longest host-named text (an execution id) a line holds whole: a host writes ids of any length.
MAX_NAME_CHARS: Final = 256


def clipped(name: str) -> str:
    """``name`` as logged: whole up to ``MAX_NAME_CHARS``, else its start and how long it was."""
    if len(name) <= MAX_NAME_CHARS:
        return name
    return f"{name[: MAX_NAME_CHARS - 32]}... ({len(name)} characters)"


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


class TextFormatter(logging.Formatter):
    """A record as one human-readable line: time, level, logger, message; an execution's line then
    carries its fields as ``key=value`` (the execution id first), so that text mode says as much
    about each execution as JSON mode, on one line. A value with spaces, quotes, ``=`` or line
    breaks (a request id, guest code) is quoted as a JSON string, and the message's control
    characters are escaped: a host's text in it (an execution id) cannot start a line of its own."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line before any traceback, its control characters escaped as JSON escapes them."""
        return _CONTROLS.sub(_escaped, super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if record.name != EXECUTIONS.name:
            return line
        fields = {key: value for key, value in vars(record).items() if key not in _STANDARD_FIELDS}
        fields.pop("outcome", None)  # the message says it
        return line + "".join(f" {key}={_text_value(value)}" for key, value in fields.items() if value is not None)


def _escaped(control: re.Match[str]) -> str:
    return json.dumps(control[0])[1:-1]


def _text_value(value: object) -> str:
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if text and _BARE_VALUE.fullmatch(text) else json.dumps(text)


class LineWriter(logging.StreamHandler):  # type: ignore[type-arg]
    """The daemon's handler: its lines reach the stream from a thread of their own, so a sink that
    is slow (a busy disk) or stops reading (a full pipe) delays no session.

    While ``serving`` (set by the server while its reactor runs), a line waits for the thread, which
    gathers for ``gather_s`` after the first one and writes what came in one write. Each wake-up of
    the thread takes the GIL from the reactor, and costs it far more than the write: a wake-up per
    reactor pass, or every 10 ms, showed in the daemon's CPU per execution at c=64; one per
    ``gather_s`` does not. At most ``buffer_bytes`` of lines wait
    for the stream; past that, lines are dropped and counted (``dropped``), and where they are
    missing a WARNING line says how many. Otherwise (start-up, shutdown) a line is written before
    ``emit`` returns, waiting at most ``drain_s`` for a stream that does not take it; ``flush``
    waits likewise."""

    def __init__(self, *, buffer_bytes: int = 4 << 20, drain_s: float = 2.0, gather_s: float = 0.1) -> None:
        super().__init__(sys.stderr)
        self.buffer_bytes, self.drain_s, self.gather_s = buffer_bytes, drain_s, gather_s
        self.serving = False
        self.dropped = 0
        self._ready = threading.Condition(threading.Lock())  # guards what follows
        self._queue: list[str | int] = []  # lines, and counts of lines dropped between them
        self._queued_bytes = 0
        self._writing = False
        self._hurry = False  # a flush waits: write without gathering
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
        self._add(text)

    def _add(self, text: str) -> None:
        with self._ready:
            if self._queue and self._queued_bytes >= self.buffer_bytes:
                self.dropped += 1
                last = self._queue[-1]
                self._queue[-1:] = [last + 1] if isinstance(last, int) else [last, 1]
                return
            self._queue.append(text + self.terminator)
            self._queued_bytes += len(text)
            if self._thread is None:
                self._thread = threading.Thread(target=self._write_lines, name="log writer", daemon=True)
                self._thread.start()
            elif len(self._queue) == 1:
                self._ready.notify_all()
        if not self.serving:
            self.flush()

    def flush(self) -> None:
        """Wait until what is queued is written: for ``drain_s`` at most, and not at all while a
        write that outlasted that wait is still stuck."""
        with self._ready:
            if not self._stuck and (self._queue or self._writing):
                self._hurry = True
                self._ready.notify_all()
                written = self._ready.wait_for(lambda: not self._queue and not self._writing, timeout=self.drain_s)
                self._stuck = not written

    def _write_lines(self) -> None:
        """The writing thread: what is queued, gathered for ``gather_s``, in one write."""
        with self._ready:
            while True:
                self._ready.wait_for(lambda: self._queue)
                self._ready.wait_for(lambda: self._hurry, timeout=self.gather_s)
                queue, self._queue, self._queued_bytes = self._queue, [], 0
                self._writing, self._hurry = True, False
                self._ready.release()
                try:
                    self._write(queue)
                finally:
                    self._ready.acquire()
                self._writing = self._stuck = False
                self._ready.notify_all()

    def _write(self, queue: list[str | int]) -> None:
        """To the stream's file descriptor where it has one: a write through the stream object would
        hold its lock, and a thread stuck in one at exit is fatal to the interpreter. A stream that
        fails (stderr closed) loses the lines, and nothing here may end the thread; logging that
        would come back here."""
        try:
            text = "".join(item if isinstance(item, str) else self._dropped_line(item) for item in queue)
            try:
                fd = self.stream.fileno()
            except (AttributeError, OSError):  # no descriptor (a StringIO)
                self.stream.write(text)
                self.stream.flush()
                return
            data = text.encode(getattr(self.stream, "encoding", None) or "utf-8", "backslashreplace")
            for chunk in _whole_lines(data, sys.maxsize if stat.S_ISREG(os.fstat(fd).st_mode) else select.PIPE_BUF):
                left = chunk
                while left:
                    left = left[os.write(fd, left) :]
        except Exception:  # noqa: S110 - logging a failure to log would come back here
            pass

    def _dropped_line(self, count: int) -> str:
        record = logging.LogRecord(
            __name__, logging.WARNING, __file__, 0, "%d log lines dropped: the log's reader fell behind", (count,), None
        )
        record.dropped_lines = count
        return self.format(record) + self.terminator


def _whole_lines(data: bytes, most: int) -> Iterator[memoryview]:
    """``data`` in writes of at most ``most`` bytes that end at line ends (a longer line alone). A
    pipe or a socket may be shared (the shards of ``--processes`` share their supervisor's stderr):
    a write of at most ``PIPE_BUF`` bytes to it is never interleaved with another's, a longer one
    may be where it has to wait for room, and lines would be cut. A file takes a write whole."""
    view, start = memoryview(data), 0
    while start < len(data):
        end = len(data) if len(data) - start <= most else data.rfind(b"\n", start, start + most) + 1
        if end <= start:  # a line longer than ``most``: alone
            end = data.find(b"\n", start) + 1 or len(data)
        yield view[start:end]
        start = end


def serving(now: bool) -> None:
    """While the daemon serves, its lines are written a little later, by the writing thread; when it
    stops, what waits is written now. No-op unless ``configure`` installed the daemon's handler."""
    for writer in _writers():
        writer.serving = now
    if not now:
        flush()


def flush() -> None:
    """Write what the daemon's handler holds now (see ``LineWriter.flush``)."""
    for writer in _writers():
        writer.flush()


def dropped_lines() -> int:
    """Lines the daemon's handler dropped because the log's reader fell behind."""
    return sum(writer.dropped for writer in _writers())


def _writers() -> list[LineWriter]:
    """The daemon's handler, where ``configure`` installed it."""
    return [handler for handler in logging.getLogger().handlers if isinstance(handler, LineWriter)]


def configure(level: str, json_lines: bool) -> None:
    # No line says which thread, process or source line logged it: finding them costs every
    # line a few microseconds (the logging HOWTO's "Optimization").
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # the documented switch for caller lookup
    handler = LineWriter()
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
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


def execution_ended(record: ExecutionEnded, peer: str, correlation: str, code: str | None, tenant: str = "") -> None:
    """The execution line; ``correlation`` is its session's correlation id; ``code`` is the guest
    code, only when the operator logs it; ``tenant`` its session's tenant (a name, never a token)."""
    fields: dict[str, object] = {
        "execution_id": clipped(record.id),
        "outcome": record.outcome,
        "error_code": record.code,
        "duration_ms": round(record.duration_s * 1000, 3),
        "tool_calls": record.tool_calls,
        "peer": peer,
        "correlation_id": correlation,
    }
    if tenant:
        fields["tenant"] = tenant
    if record.unknown_tool_codes:
        fields["unknown_tool_error_codes"] = [clipped(code) for code in dict.fromkeys(record.unknown_tool_codes)]
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
    the logging module's record and dispatch, which cost more than the line itself. Anything else that
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
