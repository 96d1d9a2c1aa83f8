"""The log lines: in JSON one object per record with its extra fields, whatever text or values they hold;
in text mode an execution's fields after its message."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO

import pytest
from hypothesis import given
from hypothesis import strategies as st

from execbox_runner.daemon.observability import logs
from execbox_runner.daemon.observability.logs import JsonFormatter, LineWriter, _whole_lines
from execbox_runner.protocol.session import ExecutionEnded

from .daemonkit import client, execute, receive, run_to_done, running_daemon


def _line(message: str, *args: object, **extra: object) -> dict[str, object]:
    record = logging.LogRecord("execbox_runner.test", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    text = JsonFormatter().format(record)
    assert "\n" not in text
    parsed: dict[str, object] = json.loads(text)
    return parsed


def test_a_line_carries_its_time_level_logger_message_and_extra_fields() -> None:
    line = _line("execution %s", "ok", execution_id="e1", duration_ms=1.5, tool_calls=0, codes=("a", "b"))
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", str(line.pop("time")))
    assert line == {
        "level": "info",
        "logger": "execbox_runner.test",
        "message": "execution ok",
        "execution_id": "e1",
        "duration_ms": 1.5,
        "tool_calls": 0,
        "codes": ["a", "b"],
    }


def test_text_with_lone_surrogates_and_values_json_cannot_hold_still_make_a_line() -> None:
    line = _line("guest said %s", "\ud800!", guest_code="x = '\udfff'", peer=object())
    assert line["message"] == "guest said \ud800!"
    assert line["guest_code"] == "x = '\udfff'"
    assert str(line["peer"]).startswith("<object object at ")
    assert _line("plain", unicode="é")["unicode"] == "é"


class _Stream(io.StringIO):
    """A stream that records which thread made each of its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: list[str] = []

    def write(self, text: str) -> int:
        self.writers.append(threading.current_thread().name)
        return super().write(text)


@contextlib.contextmanager
def logging_to(handler: LineWriter, stream: IO[str], name: str) -> Iterator[logging.Logger]:
    """A logger of its own that writes JSON lines to ``stream`` through ``handler``."""
    handler.setStream(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield logger
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def writer() -> Iterator[tuple[LineWriter, _Stream, logging.Logger]]:
    handler, stream = LineWriter(), _Stream()
    with logging_to(handler, stream, "execbox_runner.test.lines") as logger:
        yield handler, stream, logger


def written(stream: _Stream, count: int) -> list[str]:
    """The messages of the stream's lines, once it holds ``count`` of them (bounded)."""
    deadline = time.monotonic() + 10
    while stream.getvalue().count("\n") < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return [json.loads(line)["message"] for line in stream.getvalue().splitlines()]


def test_while_serving_lines_go_out_a_little_later_together(
    writer: tuple[LineWriter, _Stream, logging.Logger],
) -> None:
    handler, stream, logger = writer
    handler.gather_s = 60.0  # far longer than the test: the lines wait for the flush below
    handler.serving = True
    logger.warning("first")
    thread = threading.Thread(target=logger.warning, args=("from a thread",))
    thread.start()
    thread.join(timeout=10)
    logger.warning("second")
    assert stream.getvalue() == ""  # not written by the callers
    handler.flush()
    assert written(stream, 3) == ["first", "from a thread", "second"]
    assert stream.writers == ["log writer"]  # gathered in one write, by the writing thread
    handler.gather_s = 0.01
    logger.warning("third")  # written when the gathering ends, without a flush
    assert written(stream, 4)[3:] == ["third"] and stream.writers == ["log writer"] * 2


def test_outside_serving_a_line_is_written_before_the_call_returns(
    writer: tuple[LineWriter, _Stream, logging.Logger],
) -> None:
    handler, stream, logger = writer
    handler.gather_s = 10.0  # a flush does not wait for the gathering
    logger.warning("first")
    assert "first" in stream.getvalue()
    handler.serving = True
    logger.warning("pending")
    handler.serving = False
    handler.flush()  # what logs.serving(False) does as the reactor stops
    assert "pending" in stream.getvalue()
    thread = threading.Thread(target=logger.warning, args=("from a thread",))
    thread.start()
    thread.join(timeout=10)
    assert "from a thread" in stream.getvalue()


@pytest.fixture
def unread_pipe() -> Iterator[tuple[int, IO[str]]]:
    """A pipe's read end, and its write end as a stream nobody reads (yet)."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    stream = open(write, "w")
    try:
        yield read, stream
    finally:
        os.close(read)
        stream.close()


def drain(read: int, until: str, count: int = 1) -> str:
    """What the pipe holds, read until ``until`` is in it ``count`` times (bounded)."""
    text, deadline = "", time.monotonic() + 10
    while text.count(until) < count and time.monotonic() < deadline:
        try:
            text += os.read(read, 1 << 20).decode()
        except BlockingIOError:
            time.sleep(0.01)
    return text


LINES = 5_000


def test_a_sink_that_stops_reading_blocks_no_pass_and_the_lines_past_the_bound_are_counted(
    unread_pipe: tuple[int, IO[str]],
) -> None:
    read, stream = unread_pipe
    handler = LineWriter(buffer_bytes=16 << 10, drain_s=120.0)  # a caller that waited would take that long
    handler.serving = True
    with logging_to(handler, stream, "execbox_runner.test.unread") as logger:

        def log_lines() -> None:  # ~600 KB of lines: the pipe holds 64 KiB, the writer 32 KiB more
            for index in range(LINES):
                logger.warning("line %d %s", index, "x" * 20)

        logging_thread = threading.Thread(target=log_lines, daemon=True)
        logging_thread.start()
        logging_thread.join(timeout=30)
        assert not logging_thread.is_alive(), "a caller waited for the stream"
        assert handler.dropped > LINES // 2
        os.set_blocking(read, True)  # the reader comes back, and reads to the end
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read, 1 << 20), b"")))
        reader.start()
        handler.flush()
        logger.warning("after")
        handler.serving = False
        handler.flush()
        stream.close()
        reader.join(timeout=10)
    lines = [json.loads(line) for line in b"".join(chunks).splitlines()]
    assert lines.pop()["message"] == "after"
    dropped = [line for line in lines if "dropped_lines" in line]
    assert dropped and {line["level"] for line in dropped} == {"warning"}
    assert sum(line["dropped_lines"] for line in dropped) == handler.dropped
    following = 0  # each kept line is the one after the lines before it, those dropped counted
    for line in lines:
        if "dropped_lines" in line:
            following += line["dropped_lines"]
        else:
            assert line["message"].startswith(f"line {following} ")
            following += 1
    assert following == LINES


def test_outside_a_pass_a_stuck_sink_delays_a_line_once_by_the_drain_bound(unread_pipe: tuple[int, IO[str]]) -> None:
    read, stream = unread_pipe
    handler = LineWriter(drain_s=3.0)
    with logging_to(handler, stream, "execbox_runner.test.stuck") as logger:
        started = time.monotonic()
        logger.warning("filler %s", "x" * (128 << 10))  # more than the pipe holds: the write blocks
        waited = time.monotonic() - started
        started = time.monotonic()
        for _ in range(10):
            logger.warning("waits")  # none waits: the write is still stuck
        # The filler's line waited out the bound; any later line that did too would take as long.
        assert time.monotonic() - started < handler.drain_s <= waited
        text = drain(read, '"waits"', 10)
        handler.flush()
    assert text.count('"waits"') == 10


def test_a_broken_stream_loses_the_lines_and_raises_nothing(writer: tuple[LineWriter, _Stream, logging.Logger]) -> None:
    handler, stream, logger = writer
    stream.close()
    handler.serving = True
    logger.warning("lost")
    handler.flush()  # the writing thread met the error, and goes on
    handler.serving = False
    logger.warning("lost too")


@pytest.fixture
def daemon_logging() -> Iterator[Callable[[], _Stream]]:
    """Makes the root logger what ``logs.configure`` leaves it, writing to a stream of the test's;
    called in the test itself (pytest adds its own capturing handlers as each test's call begins)."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level

    def configure() -> _Stream:
        logs.configure("INFO", json_lines=True)
        stream = _Stream()
        root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
        return stream

    yield configure
    root.handlers[:] = saved
    root.setLevel(level)


ENDED = ExecutionEnded("e1", "error", "tool_error", 0.0123, 2, (0.001,), "1+1", ("E_CUSTOM",))


def test_the_execution_line_made_directly_is_the_line_logging_makes(
    daemon_logging: Callable[[], _Stream], monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = daemon_logging()
    made: list[logging.LogRecord] = []
    monkeypatch.setattr(logging.Logger, "makeRecord", lambda *args, **kw: made.append(args) or None)
    logs.execution_ended(ENDED, "127.0.0.1:5", "c0ffee", "1+1")
    assert made == []  # no LogRecord: the direct way
    monkeypatch.undo()
    direct = json.loads(stream.getvalue())
    other = logging.Handler()  # anything else listening: the line takes the logging module's way
    records: list[logging.LogRecord] = []
    other.emit = records.append  # type: ignore[method-assign]
    logging.getLogger().addHandler(other)
    try:
        logs.execution_ended(ENDED, "127.0.0.1:5", "c0ffee", "1+1")
    finally:
        logging.getLogger().removeHandler(other)
    assert len(records) == 1 and records[0].getMessage() == "execution error"
    through_logging = json.loads(stream.getvalue().splitlines()[1])
    assert direct.pop("time") and through_logging.pop("time")
    assert direct == through_logging
    assert list(direct) == list(through_logging)  # the same fields in the same order
    assert direct["unknown_tool_error_codes"] == ["E_CUSTOM"] and direct["guest_code"] == "1+1"


def test_no_execution_line_below_the_level(daemon_logging: Callable[[], _Stream]) -> None:
    stream = daemon_logging()
    logging.getLogger().setLevel(logging.WARNING)
    logs.execution_ended(ENDED, "127.0.0.1:5", "c0ffee", None)
    assert stream.getvalue() == ""


@given(st.lists(st.integers(min_value=0, max_value=9000), max_size=40), st.booleans())
def test_writes_to_a_pipe_hold_whole_lines_of_at_most_pipe_buf_bytes(lengths: list[int], last_line_ends: bool) -> None:
    """Each write to a pipe or socket is whole lines, at most PIPE_BUF bytes (a longer line alone),
    so that the shards' writes to a shared stderr never cut each other's lines."""
    data = b"".join(b"x" * length + b"\n" for length in lengths)
    if not last_line_ends:
        data += b"tail"
    writes = [bytes(chunk) for chunk in _whole_lines(data, select.PIPE_BUF)]
    assert b"".join(writes) == data
    for index, chunk in enumerate(writes):
        assert chunk
        is_last = index == len(writes) - 1
        assert chunk.endswith(b"\n") or (is_last and not last_line_ends)
        assert len(chunk) <= select.PIPE_BUF or chunk.count(b"\n") <= 1  # a longer line, alone
        if not is_last:  # as many lines as fit: the next one would not have
            assert len(chunk) + writes[index + 1].find(b"\n") + 1 > select.PIPE_BUF or b"\n" not in writes[index + 1]


def test_text_lines_of_executions_carry_their_fields_on_one_line() -> None:
    """In text mode an execution's line says as much as its JSON line: id, outcome, error code,
    duration, tool calls, peer, correlation id (quoted where it holds a space), over a real daemon."""
    with running_daemon("--log-format", "text", "--log-guest-code", "true") as d:
        with client(d.url, additional_headers={"X-Request-Id": "order 42"}) as ws:
            run_to_done(ws, "text-ok", "await tools.echo({})")
        with client(d.url) as ws:
            run_to_done(ws, "text-error", "throw new Error('x')\n// two lines")
        lines = d.log_lines(lambda lines: sum("execbox_runner.executions: " in line for line in lines) == 2)
    ok, error = (line for line in lines if "execbox_runner.executions: " in line)
    pattern = (
        r"\S+ \S+ INFO execbox_runner\.executions: execution ok execution_id=text-ok duration_ms=[\d.]+"
        r' tool_calls=1 peer=127\.0\.0\.1:\d+ correlation_id="order 42" guest_code="await tools\.echo\(\{\}\)"'
    )
    assert re.fullmatch(pattern, ok), ok
    pattern = (
        r"\S+ \S+ INFO execbox_runner\.executions: execution error execution_id=text-error error_code=runtime_error"
        r" duration_ms=[\d.]+ tool_calls=0 peer=127\.0\.0\.1:\d+ correlation_id=[0-9a-f]{32}"
        r' guest_code="throw new Error\(\'x\'\)\\n// two lines"'
    )
    assert re.fullmatch(pattern, error), error


def test_text_lines_of_other_records_are_unchanged() -> None:
    record = logging.LogRecord("execbox_runner.daemon.server", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    record.__dict__["shard"] = "0/2"
    assert logs.TextFormatter().format(record).endswith(" INFO execbox_runner.daemon.server: hello x")


def test_what_a_host_names_is_clipped_in_the_execution_line() -> None:
    """A host writes ids (and tool error codes) of any length: each execution wrote its megabyte id
    into the operator's logs whole, however often it was sent."""
    long_id, code = "i" * (1 << 20), "c" * 100_000
    with running_daemon() as d, client(d.url) as ws:
        ws.send(execute(long_id, "for (const i of [1, 2]) { try { await tools.echo(i) } catch {} } 1"))
        assert receive(ws)["type"] == "started"
        for _ in range(2):
            call = receive(ws)
            failure = {"code": code, "message": "no"}
            ws.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": False, "error": failure}))
        done = receive(ws)
        assert (done["type"], done["id"] == long_id, done["result"]) == ("done", True, 1)
        raw = d.log_lines(lambda lines: any('"execution ok"' in line for line in lines))
    (line,) = [line for line in raw if '"execution ok"' in line]
    fields = json.loads(line)
    assert fields["execution_id"] == "i" * (logs.MAX_NAME_CHARS - 32) + f"... ({1 << 20} characters)"
    assert fields["unknown_tool_error_codes"] == ["c" * (logs.MAX_NAME_CHARS - 32) + "... (100000 characters)"]
    assert len(line) < 2 * logs.MAX_NAME_CHARS + 1000
