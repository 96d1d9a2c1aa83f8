"""The JSON log line: one object per record with its extra fields, whatever text or values they hold."""

from __future__ import annotations

import json
import logging
import re

from execbox_runner.daemon.logs import JsonFormatter


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
