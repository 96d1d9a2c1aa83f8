"""The JSON log line: one object per record with its extra fields, whatever text or values they hold."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator

import pytest

from execbox_runner.daemon import logs
from execbox_runner.daemon.logs import JsonFormatter, LineWriter
from execbox_runner.protocol.session import ExecutionEnded


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
    """A stream that counts its writes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


@pytest.fixture
def writer() -> Iterator[tuple[LineWriter, _Stream, logging.Logger]]:
    handler, stream = LineWriter(), _Stream()
    handler.setStream(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("execbox_runner.test.lines")
    logger.addHandler(handler)
    logger.propagate = False
    yield handler, stream, logger
    logger.removeHandler(handler)


def test_lines_logged_in_a_reactor_pass_go_out_together_at_its_end(
    writer: tuple[LineWriter, _Stream, logging.Logger],
) -> None:
    handler, stream, logger = writer
    deferred: list[Callable[[], None]] = []
    handler.defer = deferred.append
    logger.warning("first")
    logger.warning("second")
    assert stream.getvalue() == "" and len(deferred) == 1  # one flush asked for, at the pass's end
    deferred.pop()()
    assert [json.loads(line)["message"] for line in stream.getvalue().splitlines()] == ["first", "second"]
    assert stream.writes == 1


def test_lines_are_written_at_once_outside_a_pass_and_from_other_threads(
    writer: tuple[LineWriter, _Stream, logging.Logger],
) -> None:
    handler, stream, logger = writer
    logger.warning("no pass")
    assert "no pass" in stream.getvalue()
    deferred: list[Callable[[], None]] = []
    handler.defer = deferred.append
    thread = threading.Thread(target=logger.warning, args=("from a thread",))
    thread.start()
    thread.join(timeout=10)
    assert "from a thread" in stream.getvalue() and not deferred
    logger.warning("pending")
    handler.defer = None
    handler.flush()  # what defer_lines(None) does as the reactor stops
    assert "pending" in stream.getvalue()


def test_a_broken_stream_loses_the_lines_and_raises_nothing(writer: tuple[LineWriter, _Stream, logging.Logger]) -> None:
    handler, stream, logger = writer
    stream.close()
    deferred: list[Callable[[], None]] = []
    handler.defer = deferred.append
    logger.warning("lost")
    deferred.pop()()  # would run at the end of a reactor pass: it must not raise there


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
