"""Session records (``--record-dir``) stream to disk: a real daemon's memory stays bounded by a
few messages however long the recorded session is (issue 11, section 5), and a record that
cannot be written never costs the session."""

from __future__ import annotations

import json
import logging
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from execbox_runner.daemon.observability.records import Recorder

from .daemonkit import client, execute, receive, run_to_done, running_daemon, running_daemon_with_site, stop

RESULT_BYTES = 10 << 20
EXECUTIONS = 30
# What the daemon may hold beyond its resting size while a session moves 10 MiB messages: a
# few of them (the frame, its parsed value, its record line). The whole session is 300 MiB.
FEW_MESSAGES_BYTES = 8 * RESULT_BYTES


def memory(pid: int, field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of a process, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def test_a_long_recorded_session_streams_to_disk_in_bounded_memory(tmp_path: Path) -> None:
    big = "x" * RESULT_BYTES
    code = "(await tools.echo('give me the big one')).length"
    with running_daemon("--record-dir", str(tmp_path)) as d:
        pid = d.process.pid
        with client(d.url) as ws:  # one message of that size first: the daemon's resting size with it
            assert run_to_done(ws, "warm", code, answer=big)["result"] == RESULT_BYTES
        resting = memory(pid, "VmRSS")
        with client(d.url) as ws:
            for index in range(EXECUTIONS):
                assert run_to_done(ws, f"big-{index}", code, answer=big)["result"] == RESULT_BYTES
            open_session = memory(pid, "VmRSS")
            assert open_session - resting < FEW_MESSAGES_BYTES, (resting, open_session)
            (partial,) = tmp_path.glob("*big-0.jsonl.partial")
            # Already on disk while the session is open, not held until it ends.
            assert partial.stat().st_size > EXECUTIONS * RESULT_BYTES
        transcripts = [partial.with_suffix("")]
        with client(d.url) as ws:  # the daemon is still well after that session
            assert run_to_done(ws, "after", "1")["ok"]
        peak = memory(pid, "VmHWM")
        assert peak - resting < FEW_MESSAGES_BYTES, (resting, peak)
    summary = json.loads(transcripts[0].with_suffix(".summary.json").read_text())
    assert [execution["id"] for execution in summary["executions"]] == [f"big-{i}" for i in range(EXECUTIONS)]
    lines = transcripts[0].read_text().splitlines()
    header = json.loads(lines[0])
    assert header["transcript"] == transcripts[0].stem and header["format"] == 1  # the kit's FORMAT
    assert sum('"type": "tool_result"' in line for line in lines) == EXECUTIONS


# The daemon's disk made slow: every append to a transcript takes a second.
SLOW_DISK = textwrap.dedent(
    """
    import os
    import time

    if os.environ.get("EXECBOX_TEST_SLOW_RECORDS"):
        from execbox_runner.daemon.observability.records import Recorder

        _append = Recorder._append

        def append(self, lines):
            time.sleep(1)
            _append(self, lines)

        Recorder._append = append
    """
)


def test_a_drain_waits_for_the_records_to_be_written(tmp_path: Path) -> None:
    """A session that ended just before SIGTERM, its transcript still being appended: the daemon
    stops only once the transcript's last lines and its summary are on disk."""
    records = tmp_path / "records"
    with running_daemon_with_site(tmp_path, SLOW_DISK, "EXECBOX_TEST_SLOW_RECORDS", "--record-dir", str(records)) as d:
        with client(d.url) as ws:
            assert run_to_done(ws, "last", "await tools.echo(2)")["result"] == 2
        assert stop(d.process) == 0
    (transcript,) = records.glob("*-last.jsonl")
    summary = json.loads(transcript.with_suffix(".summary.json").read_text())
    assert [execution["id"] for execution in summary["executions"]] == ["last"]
    assert json.loads(transcript.read_text().splitlines()[-1]) == {"host_close": True}


async def test_a_record_that_cannot_be_written_is_logged_once_and_the_session_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with trio.open_nursery() as nursery:  # the record's writer tasks run here
        recorder = Recorder(tmp_path / "removed", "127.0.0.1:1", "c0ffee", nursery.start_soon)  # its directory is gone
        recorder.host_text(execute("lost", "1").encode())
        recorder.flush()
        recorder.runner(json.dumps({"type": "started", "id": "lost"}).encode())
        recorder.flush()
        recorder.close()
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1 and "could not write the session record" in errors[0].getMessage()
    assert not (tmp_path / "removed").exists()


def test_a_transcript_is_named_jsonl_only_once_its_session_ended(tmp_path: Path) -> None:
    """While a session runs (or after a crash cut it short) its transcript is ``.jsonl.partial``,
    so ``replay records/*.jsonl`` never takes half a session for a whole one that passed. Neither
    file holds the session's bearer token."""
    token = "records-never-hold-this-token"
    with running_daemon("--record-dir", str(tmp_path), "--tokens", token) as d:
        with client(d.url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            ws.send(execute("held", "await tools.echo(1)"))
            assert receive(ws)["type"] == "started"
            call = receive(ws)
            assert call["type"] == "tool_call"
            held = wait_for_names(tmp_path)
            assert [name.endswith("-held.jsonl.partial") for name in held] == [True], held
            ws.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 1}))
            assert receive(ws)["type"] == "done"
        names = wait_for_names(tmp_path, lambda names: any(name.endswith(".summary.json") for name in names))
    (transcript,) = tmp_path.glob("*-held.jsonl")
    assert names == {transcript.name, transcript.with_suffix(".summary.json").name}
    assert not any(token in (tmp_path / name).read_text() for name in names)
    assert json.loads(transcript.read_text().splitlines()[-1]) == {"host_close": True}


def wait_for_names(directory: Path, until: Callable[[set[str]], bool] = bool) -> set[str]:
    """The names in ``directory`` once ``until`` holds of them (the records are written by a task of
    their own, a little after the messages), or after ten seconds."""
    deadline = time.monotonic() + 10
    while not until(names := {path.name for path in directory.iterdir()}) and time.monotonic() < deadline:
        time.sleep(0.02)
    return names


async def test_a_full_disk_leaves_no_half_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A write that fails midway (``ENOSPC``: the transcript is ``/dev/full``) is logged once and what
    was written is removed, so no half record is left for replay to misread."""
    async with trio.open_nursery() as nursery:
        recorder = Recorder(tmp_path, "127.0.0.1:1", "c0ffee", nursery.start_soon)
        recorder.host_text(execute("full", "1").encode())
        assert recorder.path is not None
        recorder.path.with_name(recorder.path.name + ".partial").symlink_to("/dev/full")
        recorder.flush()
        recorder.runner(json.dumps({"type": "started", "id": "full"}).encode())
        recorder.close()
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert len(errors) == 1 and "No space left on device" in errors[0].getMessage()
    assert list(tmp_path.iterdir()) == []
