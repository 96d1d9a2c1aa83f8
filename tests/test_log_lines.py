"""The JSON log line: one object per record with its extra fields, whatever text or values they hold."""

from __future__ import annotations

import io
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator

import pytest

from execbox_runner.daemon.logs import JsonFormatter, LineWriter


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
