"""A correlation id per session (issue 14, item 4): from the handshake's W3C ``traceparent`` (its
trace id), else its ``X-Request-Id``, else a new one; in every execution log line of the session,
its record, and the handshake's answer. Headers that are not well formed are ignored."""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .daemonkit import Daemon, client, run_to_done, running_daemon

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
GENERATED = re.compile(r"[0-9a-f]{32}")
SESSIONS = itertools.count()  # execution ids unique over the module's daemon


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    records = tmp_path_factory.mktemp("records")
    with running_daemon("--record-dir", str(records)) as d:
        yield d, records


def session(daemon: Daemon, exec_id: str, headers: dict[str, str] | list[tuple[str, str]]) -> str:
    """Run two executions on one connection with these handshake headers; the X-Request-Id answered."""
    with client(daemon.url, additional_headers=headers) as ws:
        assert run_to_done(ws, exec_id, "await tools.echo(1)")["ok"]
        assert run_to_done(ws, f"{exec_id}-again", "2")["ok"]
        answered = ws.response.headers["X-Request-Id"]
    return str(answered)


def execution_lines(daemon: Daemon, exec_id: str) -> list[dict[str, Any]]:
    """The log lines of ``exec_id`` and of the execution after it in its session (bounded wait)."""

    def found(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [line for line in lines if line.get("execution_id") in {exec_id, f"{exec_id}-again"}]

    return found(daemon.json_lines(until=lambda lines: len(found(lines)) == 2))


def test_the_trace_id_of_a_traceparent_is_the_sessions_correlation_id(recording: tuple[Daemon, Path]) -> None:
    daemon, records = recording
    assert session(daemon, "traced", {"traceparent": TRACEPARENT, "X-Request-Id": "not-this"}) == TRACE_ID
    assert [line["correlation_id"] for line in execution_lines(daemon, "traced")] == [TRACE_ID, TRACE_ID]
    deadline = time.monotonic() + 10  # the transcript is complete, and the summary written, once the session ended
    while not list(records.glob("*-traced.summary.json")) and time.monotonic() < deadline:
        time.sleep(0.05)
    (transcript,) = records.glob("*-traced.jsonl")
    assert json.loads(transcript.read_text().splitlines()[0])["correlation_id"] == TRACE_ID
    assert json.loads(transcript.with_suffix(".summary.json").read_text())["correlation_id"] == TRACE_ID


@pytest.mark.parametrize(
    "traceparent",
    [
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # an all-zero trace id
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",  # not lowercase
        f"00-{TRACE_ID}-{'0' * 16}-01",  # an all-zero parent id
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # the forbidden version
        f"00-{TRACE_ID}-00f067aa0ba902b7-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE_ID[:-1]}-00f067aa0ba902b7-01",  # too short
    ],
)
def test_an_invalid_traceparent_is_ignored_for_the_request_id(recording: tuple[Daemon, Path], traceparent: str) -> None:
    daemon, _ = recording
    exec_id = f"requested-{next(SESSIONS)}"
    headers = {"traceparent": traceparent, "X-Request-Id": "req-42 from host"}
    assert session(daemon, exec_id, headers) == "req-42 from host"
    assert {line["correlation_id"] for line in execution_lines(daemon, exec_id)} == {"req-42 from host"}


def test_a_later_traceparent_version_is_read_for_its_trace_id(recording: tuple[Daemon, Path]) -> None:
    daemon, _ = recording
    assert (
        session(daemon, f"future-{next(SESSIONS)}", {"traceparent": f"01-{TRACE_ID}-00f067aa0ba902b7-01-more"})
        == TRACE_ID
    )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"X-Request-Id": "x" * 129},  # too long
        {"X-Request-Id": "tab\there"},  # not printable
        [("X-Request-Id", "one"), ("X-Request-Id", "two")],  # which one?
        [("traceparent", TRACEPARENT), ("traceparent", TRACEPARENT)],
    ],
)
def test_without_a_usable_header_each_session_gets_a_new_id(
    recording: tuple[Daemon, Path], headers: dict[str, str] | list[tuple[str, str]]
) -> None:
    daemon, _ = recording
    ids = [f"new-{next(SESSIONS)}" for _ in range(2)]
    first, second = (session(daemon, exec_id, headers) for exec_id in ids)
    assert GENERATED.fullmatch(first) and GENERATED.fullmatch(second) and first != second
    assert {line["correlation_id"] for line in execution_lines(daemon, ids[0])} == {first}
    assert {line["correlation_id"] for line in execution_lines(daemon, ids[1])} == {second}
