"""The golden transcripts, replayed against the real daemon over real WebSockets.

One daemon subprocess (started exactly as an operator would, on a free port)
serves the whole module. Every transcript in ``transcripts/`` is one test. The
``execbox-conformance`` command is run once as a subprocess, and deliberately
wrong transcripts show that the harness can fail.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from execbox_runner_conformance.harness import (
    DEFAULT_TRANSCRIPTS,
    Mismatch,
    load_transcript,
    match,
    run_all,
    run_transcript,
    transcript_paths,
)

from .daemonkit import running_daemon

REPO = Path(__file__).resolve().parent.parent
TRANSCRIPTS = transcript_paths(DEFAULT_TRANSCRIPTS)
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
OPTIONS = {"timeoutMs": 5000, "memoryLimitBytes": 67108864, "maxLogLines": 100, "maxLogChars": 64000}
PROVIDERS = [{"name": "tools", "tools": {"echo": {"safeName": "echo"}}}]


@pytest.fixture(scope="module")
def runner_url() -> Iterator[str]:
    """The URL of a daemon started as an operator would, on a free port."""
    with running_daemon() as daemon:
        yield daemon.url


def test_transcripts_exist_and_are_named_after_their_files() -> None:
    assert len(TRANSCRIPTS) >= 40
    for path in TRANSCRIPTS:
        transcript = load_transcript(path)
        assert transcript.name == path.stem, path
        assert transcript.description, path


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[path.stem for path in TRANSCRIPTS])
def test_transcript(runner_url: str, path: Path) -> None:
    result = run_transcript(runner_url, path)
    assert result.passed, result.reason


def test_conformance_command(runner_url: str) -> None:
    """The console script itself, as CI or another runner's author would run it."""
    completed = subprocess.run(
        [_console_script("execbox-conformance"), runner_url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    lines = completed.stdout.strip().splitlines()
    assert lines, completed.stderr
    assert lines[-1] == f"{len(TRANSCRIPTS)} passed, 0 failed", completed.stdout
    assert completed.returncode == 0, completed.stdout
    assert sum(line.startswith("PASS ") for line in lines) == len(TRANSCRIPTS)


def _console_script(name: str) -> str:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed (pip install -e .)"
    return found


# ---------------------------------------------------------------------- the harness can fail


def _write(directory: Path, name: str, steps: list[dict[str, Any]]) -> Path:
    path = directory / f"{name}.jsonl"
    header = {"transcript": name, "description": "a deliberately wrong transcript"}
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *steps]))
    return path


def _execute(exec_id: str, code: str) -> dict[str, Any]:
    return {"host": {"type": "execute", "id": exec_id, "code": code, "options": OPTIONS, "providers": PROVIDERS}}


def _done(exec_id: str, **fields: Any) -> dict[str, Any]:
    return {"runner": {"type": "done", "id": exec_id, "ok": True, "durationMs": "<number>", "logs": [], **fields}}


WRONG: list[tuple[str, list[dict[str, Any]], str]] = [
    (
        "wrong-result",
        [_execute("x", "1 + 1"), {"runner": {"type": "started", "id": "x"}}, _done("x", result=3)],
        "at $.result: expected 3, got 2",
    ),
    (
        "boolean-is-not-number",
        [_execute("x", "1"), {"runner": {"type": "started", "id": "x"}}, _done("x", result=True)],
        "at $.result: expected true, got 1",
    ),
    (
        "result-key-must-be-absent",
        [_execute("x", "1"), {"runner": {"type": "started", "id": "x"}}, _done("x")],
        "unexpected key(s) 'result'",
    ),
    (
        "result-key-must-be-present",
        [_execute("x", ""), {"runner": {"type": "started", "id": "x"}}, _done("x", result="<any>")],
        "missing key(s) 'result'",
    ),
    ("skipped-started", [_execute("x", "1"), _done("x", result=1)], 'at $.type: expected "done", got "started"'),
    (
        "duration-range",
        [
            _execute("x", "1"),
            {"runner": {"type": "started", "id": "x"}},
            _done("x", durationMs="<number:100000..>", result=1),
        ],
        "expected a number in 100000..",
    ),
    (
        "close-that-never-comes",
        [_execute("x", "1"), {"runner_close": {"code": 1008}}],
        "expected the runner to close with 1008, got message",
    ),
    (
        "wrong-close-code",
        [{"host_raw": "not json"}, {"runner_close": {"code": 1008}}],
        "expected close code 1008, got 1007",
    ),
    ("silence-broken", [_execute("x", "1"), {"runner_silent_ms": 200}], "expected no message for 200 ms"),
    (
        "message-that-never-comes",
        [{"runner": {"type": "started", "id": "x"}, "timeout_ms": 200}],
        "timed out after 0.2 s",
    ),
    (
        "unbound-name",
        [{"host": {"type": "tool_result", "callId": "<bind:nope>", "ok": True}}],
        "no runner message has bound yet",
    ),
    (
        "callid-rebinding",
        [
            _execute("x", "await tools.echo(1); await tools.echo(2)"),
            {"runner": {"type": "started", "id": "x"}},
            {
                "runner": {
                    "type": "tool_call",
                    "callId": "<unique:a>",
                    "providerName": "tools",
                    "safeToolName": "echo",
                    "input": 1,
                }
            },
            {"host": {"type": "tool_result", "callId": "<bind:a>", "ok": True}},
            {
                "runner": {
                    "type": "tool_call",
                    "callId": "<bind:a>",
                    "providerName": "tools",
                    "safeToolName": "echo",
                    "input": 2,
                }
            },
        ],
        "expected a = ",
    ),
    ("unknown-step", [{"runner_says": {}}], "invalid transcript"),
]


@pytest.mark.parametrize(("name", "steps", "reason"), WRONG, ids=[case[0] for case in WRONG])
def test_harness_detects_mismatch(
    runner_url: str, tmp_path: Path, name: str, steps: list[dict[str, Any]], reason: str
) -> None:
    result = run_transcript(runner_url, _write(tmp_path, name, steps), timeout=2.0)
    assert not result.passed
    assert reason in result.reason


def test_harness_reports_expected_and_actual(runner_url: str, tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "wrong",
        [_execute("x", "'real'"), {"runner": {"type": "started", "id": "x"}}, _done("x", result="imagined")],
    )
    (result,) = run_all(runner_url, tmp_path)
    assert not result.passed
    assert result.line().startswith("FAIL wrong")
    assert '"result":"imagined"' in result.reason and '"result":"real"' in result.reason
    assert path.exists()


def test_conformance_command_fails_on_mismatch(runner_url: str, tmp_path: Path) -> None:
    _write(tmp_path, "good", [_execute("x", "2"), {"runner": {"type": "started", "id": "x"}}, _done("x", result=2)])
    _write(tmp_path, "bad", [_execute("x", "2"), {"runner": {"type": "started", "id": "x"}}, _done("x", result=5)])
    completed = subprocess.run(
        [_console_script("execbox-conformance"), runner_url, "--transcripts", str(tmp_path), "--timeout", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = completed.stdout.strip().splitlines()
    assert completed.returncode == 1
    assert lines[-1] == "1 passed, 1 failed"
    assert any(line.startswith("FAIL bad") for line in lines)
    assert any(line.startswith("PASS good") for line in lines)


def test_match_placeholders() -> None:
    """The matcher alone, without a runner: placeholders, exact keys, and JSON types."""
    bindings: dict[str, str] = {}
    match(
        {"a": "<any>", "s": "<string>", "n": "<number>", "r": "<number:1..2>", "id": "<unique:c>"},
        {"a": [1], "s": "x", "n": 1.5, "r": 2, "id": "call-1"},
        bindings,
    )
    assert bindings == {"c": "call-1"}
    match("<bind:c>", "call-1", bindings)
    failures: list[tuple[Any, Any]] = [
        ("<bind:c>", "call-2"),
        ("<unique:d>", "call-1"),
        ("<number>", True),
        ("<number>", "1"),
        ("<string>", 1),
        ("<number:..0>", 1),
        (1, True),
        (0, False),
        ({"a": 1}, {"a": 1, "b": 2}),
        ([1, 2], [1]),
        ("<not-a-placeholder>", "x"),
    ]
    for expected, actual in failures:
        with pytest.raises(Mismatch):
            match(expected, actual, dict(bindings))
    match("<not-a-placeholder>", "<not-a-placeholder>", bindings)
    match(1, 1.0, bindings)  # JSON does not tell 1 from 1.0
