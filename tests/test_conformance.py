"""The conformance kit: the golden transcripts against the real daemon, and the kit as a CI tool.

Daemons are started as an operator would, on free loopback ports, one per
module for each configuration: open, protected by a token and an Origin list,
and TLS with a test CA. Every transcript in ``transcripts/`` is one test; the
``execbox-conformance`` command is run as a subprocess to check its options,
reports and exit statuses; deliberately wrong transcripts show that it can fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from execbox_runner_conformance import (
    BUILTIN_TRANSCRIPTS,
    Mismatch,
    Result,
    TargetError,
    TranscriptError,
    discover,
    harness,
    json_report,
    junit_xml,
    load_transcript,
    match,
    run_all,
    run_transcript,
    summary,
    transcript_paths,
)
from execbox_runner_conformance.cli import DEPRECATED_TOKEN_ENV, TOKEN_ENV, URL_ENV

from execbox_runner import __version__

from .daemonkit import running_daemon, scripted_runner, stop

REPO = Path(__file__).resolve().parent.parent
TRANSCRIPTS = transcript_paths(BUILTIN_TRANSCRIPTS)
# This runner's own choices where the specification leaves one (close codes, error positions, ...):
# checked against this daemon only, never part of the kit that judges other runners.
OWN_TRANSCRIPTS = transcript_paths(REPO / "tests" / "transcripts")
SPEC = ["spec-minimal-cancellation", "spec-minimal-success"]
OPTIONS = {"timeoutMs": 5000, "memoryLimitBytes": 67108864, "maxLogLines": 100, "maxLogChars": 64000}
PROVIDERS = [{"name": "tools", "tools": {"echo": {"safeName": "echo"}}}]
TOKEN = "conformance-s3cret"
ORIGIN = "https://host.example"


@pytest.fixture(scope="module")
def runner_url() -> Iterator[str]:
    """The URL of a daemon started as an operator would, on a free port."""
    with running_daemon() as daemon:
        yield daemon.url


@pytest.fixture(scope="module")
def protected_url() -> Iterator[str]:
    """A daemon that needs a bearer token and refuses Origins other than ``ORIGIN``."""
    with running_daemon("--tokens", TOKEN, "--allowed-origins", ORIGIN) as daemon:
        yield daemon.url


@pytest.fixture(scope="module")
def tls_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A ``wss://`` daemon with a certificate from a test CA, and that CA's certificate file."""
    directory = tmp_path_factory.mktemp("tls")
    authority = trustme.CA()
    certificate = authority.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile, cafile = directory / "cert.pem", directory / "key.pem", directory / "ca.pem"
    certificate.cert_chain_pems[0].write_to_path(str(certfile))
    certificate.private_key_pem.write_to_path(str(keyfile))
    authority.cert_pem.write_to_path(str(cafile))
    # Over TLS the daemon waits --close-timeout for the host's EOF after the closing handshake while the
    # host waits for the daemon's (websockets' 2 s), so each transcript would take 2 s more than it needs.
    with running_daemon("--certfile", str(certfile), "--keyfile", str(keyfile), "--close-timeout", "0.1") as daemon:
        assert daemon.url.startswith("wss://")
        yield daemon.url, cafile


def conformance(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed console script, as another runner's CI would run it (no token from this environment)."""
    environment = {
        name: value for name, value in os.environ.items() if name not in (TOKEN_ENV, DEPRECATED_TOKEN_ENV, URL_ENV)
    }
    return subprocess.run(
        [_console_script("execbox-conformance"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**environment, **(env or {})},
    )


def _console_script(name: str) -> str:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed (pip install -e .)"
    return found


def assert_one_line_error(completed: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit status 2, nothing judged, and one ``error:`` line on stderr that says what is wrong."""
    assert completed.returncode == 2, (completed.returncode, completed.stdout, completed.stderr)
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith("execbox-conformance: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    assert "PASS" not in completed.stdout and "FAIL" not in completed.stdout


def verdicts(output: str) -> list[str]:
    """``PASS name`` / ``FAIL name`` for each transcript line of the command's output, in order."""
    return [" ".join(line.split()[:2]) for line in output.splitlines() if line.startswith(("PASS ", "FAIL "))]


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ---------------------------------------------------------------------- the golden transcripts


def test_transcripts_exist_and_are_named_after_their_files() -> None:
    assert len(TRANSCRIPTS) >= 40
    for path in TRANSCRIPTS:
        transcript = load_transcript(path)
        assert transcript.name == path.stem, path
        assert transcript.description, path
        assert transcript.builtin, path


def test_this_runners_own_transcripts_can_run_beside_the_kits() -> None:
    """``--transcripts tests/transcripts`` with the built-in ones: loadable, and no name used twice."""
    assert OWN_TRANSCRIPTS
    own = discover([REPO / "tests" / "transcripts"])
    assert [transcript.name for transcript in own if not transcript.builtin] == [path.stem for path in OWN_TRANSCRIPTS]


@pytest.mark.parametrize(
    "path", TRANSCRIPTS + OWN_TRANSCRIPTS, ids=[path.stem for path in TRANSCRIPTS + OWN_TRANSCRIPTS]
)
def test_transcript(runner_url: str, path: Path) -> None:
    result = run_transcript(runner_url, path)
    assert result.passed, result.reason


def test_conformance_command(runner_url: str) -> None:
    """The console script itself, as CI or another runner's author would run it."""
    completed = conformance(runner_url)
    lines = completed.stdout.strip().splitlines()
    assert lines, completed.stderr
    assert lines[-1] == f"{len(TRANSCRIPTS)} passed, 0 failed", completed.stdout
    assert completed.returncode == 0, completed.stdout
    assert verdicts(completed.stdout) == [f"PASS {path.stem}" for path in TRANSCRIPTS]


# ---------------------------------------------------------------------- selection and reports


def test_list_prints_the_selected_transcripts_and_connects_to_nothing() -> None:
    nobody = f"ws://127.0.0.1:{free_port()}/"  # listing must not even try it
    everything = conformance(nobody, "--list")
    assert everything.returncode == 0, everything.stderr
    lines = everything.stdout.splitlines()
    assert [line.split()[0] for line in lines] == [path.stem for path in TRANSCRIPTS]
    for line, path in zip(lines, TRANSCRIPTS, strict=True):
        assert line.endswith(load_transcript(path).description)
    selected = conformance("--list", "-k", "spec-", "-k", "code-empty")
    assert [line.split()[0] for line in selected.stdout.splitlines()] == ["code-empty", *SPEC]
    as_json = conformance("--list", "--json", "-k", "spec-")
    assert json.loads(as_json.stdout) == {
        "transcripts": [
            {
                "name": name,
                "description": load_transcript(BUILTIN_TRANSCRIPTS / f"{name}.jsonl").description,
                "file": str(BUILTIN_TRANSCRIPTS / f"{name}.jsonl"),
                "builtin": True,
                "extensions": [],
            }
            for name in SPEC
        ]
    }
    module = subprocess.run(
        [sys.executable, "-m", "execbox_runner_conformance", "--list", "-k", "spec-"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert module.returncode == 0 and [line.split()[0] for line in module.stdout.splitlines()] == SPEC


def test_the_kit_runs_from_a_source_checkout() -> None:
    """``python -m conformance`` in a checkout finds the transcripts beside it, as a kit developer runs it."""
    completed = subprocess.run(
        [sys.executable, "-m", "conformance", "--list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert completed.returncode == 0, completed.stderr
    files = [item["file"] for item in json.loads(completed.stdout)["transcripts"]]
    assert files == [str(path) for path in transcript_paths(REPO / "transcripts")]


def test_repeated_k_selects_any_match_and_json_reports_the_results(runner_url: str) -> None:
    completed = conformance(runner_url, "-k", "spec-", "-k", "code-empty", "--json")
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)  # stdout is the JSON document and nothing else
    assert {key: report[key] for key in ("url", "ok", "passed", "failed")} == {
        "url": runner_url,
        "ok": True,
        "passed": 3,
        "failed": 0,
    }
    assert [result["name"] for result in report["results"]] == ["code-empty", *SPEC]
    for result in report["results"]:
        assert result["passed"] is True and result["failure"] is None and result["builtin"] is True
        assert Path(result["file"]).name == f"{result['name']}.jsonl"
        assert 0 < result["seconds"] < 10
    assert verdicts(completed.stderr) == ["PASS code-empty", *(f"PASS {name}" for name in SPEC)]
    assert completed.stderr.strip().splitlines()[-1] == "3 passed, 0 failed"


def test_user_transcripts_run_after_the_builtin_ones_and_junit_xml_reports_them(
    runner_url: str, tmp_path: Path
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    _write(mine, "mine-good", [_execute("x", "2"), {"runner": {"type": "started", "id": "x"}}, _done("x", result=2)])
    _write(mine, "mine-bad", [_execute("x", "2"), {"runner": {"type": "started", "id": "x"}}, _done("x", result=5)])
    report = tmp_path / "junit.xml"
    completed = conformance(
        runner_url, "--transcripts", str(mine), "-k", "spec-", "-k", "mine-", "--junit-xml", str(report)
    )
    assert completed.returncode == 1, completed.stderr
    order = [*SPEC, "mine-bad", "mine-good"]
    assert verdicts(completed.stdout) == ["PASS " + SPEC[0], "PASS " + SPEC[1], "FAIL mine-bad", "PASS mine-good"]
    assert completed.stdout.strip().splitlines()[-1] == "3 passed, 1 failed"

    root = ET.parse(report).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "execbox-conformance"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "1", "0")
    assert [prop.get("value") for prop in suite.iter("property") if prop.get("name") == "url"] == [runner_url]
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert list(cases) == order
    for name, case in cases.items():
        origin = "user" if name.startswith("mine-") else "builtin"
        assert case.get("classname") == f"execbox-conformance.{origin}"
        assert 0 <= float(case.get("time", "")) < 10
        assert Path(case.get("file", "")).name == f"{name}.jsonl"
        assert (case.find("failure") is None) == (name != "mine-bad")
    failure = cases["mine-bad"].find("failure")
    assert failure is not None
    assert failure.get("message") == "step 3 (line 4, runner): at $.result: expected 5, got 2"
    assert failure.text is not None and '"result":5' in failure.text and '"result":2' in failure.text


def test_the_readme_example_transcript_passes_on_its_own(runner_url: str, tmp_path: Path) -> None:
    """The user transcript that transcripts/README.md shows, run as it says, with --no-builtin."""
    readme = (REPO / "transcripts" / "README.md").read_text()
    (example,) = re.findall(r"```jsonl\n(.*?)```", readme, flags=re.DOTALL)
    name = json.loads(example.splitlines()[0])["transcript"]
    assert f"my-transcripts/{name}.jsonl" in readme
    (tmp_path / f"{name}.jsonl").write_text(example)
    completed = conformance(runner_url, "--transcripts", str(tmp_path), "--no-builtin")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert verdicts(completed.stdout) == [f"PASS {name}"]
    assert completed.stdout.strip().splitlines()[-1] == "1 passed, 0 failed"


def test_a_user_transcript_cannot_reuse_a_builtin_name(tmp_path: Path) -> None:
    shutil.copy(BUILTIN_TRANSCRIPTS / "spec-minimal-success.jsonl", tmp_path)
    assert_one_line_error(
        conformance("--list", "--transcripts", str(tmp_path)),
        "two transcripts are named 'spec-minimal-success'",
        "--no-builtin",
    )
    only_mine = conformance("--list", "--transcripts", str(tmp_path), "--no-builtin")
    assert only_mine.returncode == 0 and [line.split()[0] for line in only_mine.stdout.splitlines()] == [SPEC[1]]


def test_a_malformed_user_transcript_stops_the_run_before_it_connects(tmp_path: Path) -> None:
    path = _write(tmp_path, "broken", [{"runner_says": {}}])
    completed = conformance(f"ws://127.0.0.1:{free_port()}/", "--transcripts", str(tmp_path))
    assert_one_line_error(completed, f"{path}: line 2: a step has exactly one of")
    # The first API, which `execbox-runner replay` uses, makes it that file's failure instead.
    result = harness.run_transcript(f"ws://127.0.0.1:{free_port()}/", path)
    assert not result.passed and "invalid transcript" in result.reason


def test_junit_and_json_carry_any_text_a_runner_sends() -> None:
    """Control characters and lone surrogates from a runner's frames cannot break either report."""
    transcript = load_transcript(BUILTIN_TRANSCRIPTS / "code-empty.jsonl")
    result = Result(transcript, False, 'at $.result: expected 1, got "\x01\ud800"', seconds=0.5)
    (case,) = ET.fromstring(junit_xml([result], "ws://x/")).iter("testcase")
    failure = case.find("failure")
    assert failure is not None and failure.get("message") == 'at $.result: expected 1, got "\\u0001\\ud800"'
    document = json.loads(json.dumps(json_report([result], "ws://x/")))
    assert document["ok"] is False and document["results"][0]["failure"]["message"] == result.difference


# ---------------------------------------------------------------------- reaching a runner


def test_token_and_headers_reach_a_protected_runner(protected_url: str) -> None:
    flags = conformance(protected_url, "--token", TOKEN, "--header", f"Origin:{ORIGIN}", "-k", "spec-")
    from_env = conformance("-k", "spec-", env={URL_ENV: protected_url, TOKEN_ENV: TOKEN})
    as_header = conformance(protected_url, "--header", f"Authorization: Bearer {TOKEN}", "-k", "spec-")
    deprecated = conformance(protected_url, "-k", "spec-", env={DEPRECATED_TOKEN_ENV: TOKEN})
    for completed in (flags, from_env, as_header, deprecated):
        assert completed.returncode == 0, completed.stderr
        assert verdicts(completed.stdout) == [f"PASS {name}" for name in SPEC]
    assert deprecated.stderr == (
        "execbox-conformance: warning: EXECBOX_CONFORMANCE_TOKEN is deprecated; set EXECBOX_RUNNER_TOKEN instead\n"
    )
    forbidden = conformance(protected_url, "--token", TOKEN, "--header", "Origin:https://evil.example", "-k", "spec-")
    assert_one_line_error(forbidden, f"the runner at {protected_url} refused the WebSocket handshake: HTTP 403")


@pytest.mark.parametrize("args", [[], ["--token", "wrong"]], ids=["no-token", "wrong-token"])
def test_an_unauthorized_handshake_is_one_clear_line(protected_url: str, args: list[str]) -> None:
    completed = conformance(protected_url, *args)
    assert_one_line_error(completed, "refused the WebSocket handshake: HTTP 401 Unauthorized", "--token")


def test_version_names_the_distribution_that_ships_the_kit() -> None:
    done = conformance("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"execbox-conformance {__version__}\n", "")


def test_an_unreachable_runner_is_one_clear_line() -> None:
    url = f"ws://127.0.0.1:{free_port()}/"
    assert_one_line_error(conformance(url), f"cannot connect to {url}: Connection refused")
    with pytest.raises(TargetError, match="cannot connect"):
        run_all(url, discover(select="spec-"))


def test_a_runner_that_goes_away_mid_run_fails_the_rest() -> None:
    """Once the runner has answered, a refused connection is a transcript's failure, not a usage error."""
    with running_daemon() as daemon:
        results = run_all(daemon.url, discover(select="spec-"), progress=lambda _: stop(daemon.process))
    assert [result.passed for result in results] == [True, False]
    assert results[1].difference.startswith(f"cannot connect to {daemon.url}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["http://127.0.0.1:1/"], "invalid URL 'http://127.0.0.1:1/'"),
        (["127.0.0.1:8765"], "invalid URL"),
        ([], "the runner's URL is missing"),
        (["ws://127.0.0.1:1/", "--cafile", "ca.pem"], "--cafile and --insecure are for wss:// URLs"),
        (["wss://127.0.0.1:1/", "--cafile", "/nonexistent/ca.pem"], "cannot load --cafile"),
        (["ws://127.0.0.1:1/", "--no-builtin"], "--no-builtin needs at least one --transcripts DIR"),
        (["ws://127.0.0.1:1/", "--transcripts", "/nonexistent"], "no transcripts directory /nonexistent"),
        (["ws://127.0.0.1:1/", "-k", "no-such", "-k", "nor-this"], "contains 'no-such' or 'nor-this'"),
    ],
)
def test_usage_errors_are_one_clear_line(args: list[str], message: str) -> None:
    assert_one_line_error(conformance(*args), message)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ws://127.0.0.1:1/", "--header", "no-colon"], "argument --header: expected NAME:VALUE"),
        (["ws://127.0.0.1:1/", "--timeout", "0"], "expected a positive number of seconds up to 86400, got '0'"),
        (["ws://127.0.0.1:1/", "--timeout", "1e10"], "expected a positive number of seconds up to 86400, got '1e10'"),
        (["ws://127.0.0.1:1/", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["ws://127.0.0.1:1/", "ws://127.0.0.1:2/"], "unrecognized arguments: ws://127.0.0.1:2/"),
        (["wss://127.0.0.1:1/", "--cafile", "ca.pem", "--insecure"], "not allowed with argument --cafile"),
    ],
)
def test_options_the_parser_refuses_are_one_clear_line(args: list[str], message: str) -> None:
    assert_one_line_error(conformance(*args), message, "(see --help)")


def test_wss_with_cafile_or_insecure(tls_runner: tuple[str, Path]) -> None:
    url, cafile = tls_runner
    for completed in (
        conformance(url, "--cafile", str(cafile), "-k", "spec-"),
        conformance(url, "--insecure", "-k", "spec-"),
    ):
        assert completed.returncode == 0, completed.stderr
        assert verdicts(completed.stdout) == [f"PASS {name}" for name in SPEC]


def test_an_untrusted_certificate_is_one_clear_line(tls_runner: tuple[str, Path], tmp_path: Path) -> None:
    url, _ = tls_runner
    assert_one_line_error(conformance(url, "-k", "spec-"), f"cannot verify the TLS certificate of {url}", "--cafile")
    stranger = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(stranger))
    assert_one_line_error(conformance(url, "--cafile", str(stranger)), "cannot verify the TLS certificate")


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
        "tool-result-missing",  # a record whose tool results were lost: the runner waits for one
        [
            _execute("x", "await tools.echo(1)"),
            {"runner": {"type": "started", "id": "x"}},
            {
                "runner": {"type": "tool_call", "callId": "<bind:e1c1>", "providerName": "tools"}
                | {"safeToolName": "echo", "input": 1}
            },
            _done("x", result=1),
        ],
        "(the transcript never answers the tool call e1c1: are its tool results missing?)",
    ),
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
]


@pytest.mark.parametrize(("name", "steps", "reason"), WRONG, ids=[case[0] for case in WRONG])
def test_harness_detects_mismatch(
    runner_url: str, tmp_path: Path, name: str, steps: list[dict[str, Any]], reason: str
) -> None:
    result = run_transcript(runner_url, _write(tmp_path, name, steps), timeout=2.0)
    assert not result.passed
    assert reason in result.reason


def test_harness_reports_expected_and_actual(runner_url: str, tmp_path: Path) -> None:
    _write(
        tmp_path,
        "wrong",
        [_execute("x", "'real'"), {"runner": {"type": "started", "id": "x"}}, _done("x", result="imagined")],
    )
    (result,) = run_all(runner_url, discover([tmp_path], builtin=False))
    assert not result.passed
    assert result.line().startswith("FAIL wrong")
    assert result.difference == 'step 3 (line 4, runner): at $.result: expected "imagined", got "real"'
    assert '"result":"imagined"' in result.detail and '"result":"real"' in result.detail


def sends_lines_in_two_messages(connection: Any, received: list[Any]) -> None:
    """A runner that sends an execution's three log lines as ["a", "b"] then ["c"]."""
    exec_id = json.loads(connection.recv(timeout=10))["id"]
    connection.send(json.dumps({"type": "started", "id": exec_id}))
    for lines in (["a", "b"], ["c"]):
        connection.send(json.dumps({"type": "log", "id": exec_id, "lines": lines}))
    connection.send(json.dumps({"type": "done", "id": exec_id, "ok": True, "durationMs": 1, "logs": ["a", "b", "c"]}))
    connection.recv(timeout=10)


@pytest.mark.parametrize(
    ("grouping", "difference"),
    [
        ([["a"], ["b", "c"]], ""),  # grouped otherwise than the runner did: the same lines
        ([["a", "b", "c"]], ""),
        ([["a"], ["c", "b"]], 'step 4 (line 5, runner): at $.lines[0]: expected "c", got "b"'),
        ([["a"]], 'step 4 (line 5, runner): the runner sent log lines the transcript does not expect: ["b"]'),
    ],
    ids=["regrouped", "together", "out of order", "more lines"],
)
def test_log_lines_match_however_the_runner_groups_them(
    tmp_path: Path, grouping: list[list[str]], difference: str
) -> None:
    """A log message has one or more lines (the spec's live-logs): which ones travel together is
    timing, so a recorded session's log steps match the same lines grouped otherwise, in order."""
    logs = [{"runner": {"type": "log", "id": "x", "lines": lines}} for lines in grouping]
    steps = [_execute("x", "logs"), {"runner": {"type": "started", "id": "x"}}, *logs, _done("x", logs=["a", "b", "c"])]
    with scripted_runner(sends_lines_in_two_messages) as (url, _):
        result = run_transcript(url, _write(tmp_path, "grouped", steps), timeout=5.0)
    assert (result.passed, result.difference) == (not difference, difference)


def sends_after_its_done(late: list[dict[str, Any]]) -> Callable[[Any, list[Any]], None]:
    """A runner that answers an execute with started and done, then sends ``late``: in the same write
    as the done, so that the host's close, which the done prompts, cannot come before ``late`` leaves."""

    def script(connection: Any, received: list[Any]) -> None:
        exec_id = json.loads(connection.recv(timeout=10))["id"]
        connection.send(json.dumps({"type": "started", "id": exec_id}))
        with connection.send_context():  # websockets writes what the protocol holds as this ends
            done = {"type": "done", "id": exec_id, "ok": True, "durationMs": 1, "logs": []}
            for message in (done, *late):
                connection.protocol.send_text(json.dumps(message).encode())
        connection.recv(timeout=10)  # until the host closes

    return script


@pytest.mark.parametrize(
    ("late", "sent"),
    [
        ([], ""),
        ([{"type": "done", "id": "x", "ok": True, "durationMs": 1, "logs": []}], '{"type":"done","id":"x"'),
        (
            [{"type": "tool_call", "callId": "c", "providerName": "tools", "safeToolName": "echo"}],
            '{"type":"tool_call"',
        ),
        ([{"type": "log", "id": "x", "lines": ["late"]}], '{"type":"log"'),
    ],
    ids=["nothing", "second done", "tool call", "log"],
)
def test_a_message_after_the_done_is_a_difference(tmp_path: Path, late: list[dict[str, Any]], sent: str) -> None:
    """Spec, State Machine: after done no further protocol messages are valid, so a transcript ending with
    a done fails on a runner that sends anything after it (before it answers the host's close)."""
    steps = [_execute("x", "undefined"), {"runner": {"type": "started", "id": "x"}}, _done("x")]
    with scripted_runner(sends_after_its_done(late)) as (url, _):
        result = run_transcript(url, _write(tmp_path, "after-done", steps), timeout=5.0)
    assert result.passed == (not late)
    if late:
        assert result.difference.startswith(f"after step 3 (line 4, the done): the runner sent {sent}")
        assert result.difference.endswith("after the done; nothing may follow a done")


def test_match_placeholders() -> None:
    """The matcher alone, without a runner: placeholders, exact keys, and JSON types."""
    bindings: dict[str, str] = {}
    match(
        {"a": "<any>", "s": "<string>", "n": "<number>", "r": "<number:1..2>", "id": "<unique:c>", "o": "<one-of:x|y>"},
        {"a": [1], "s": "x", "n": 1.5, "r": 2, "id": "call-1", "o": "y"},
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
        ("<one-of:x|y>", "z"),
        ("<one-of:x|y>", "x|y"),
        ("<one-of:1|2>", 1),
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


# ---------------------------------------------------------------------- extensions


def accepts_and_waits(connection: Any, received: list[Any]) -> None:
    """A runner that offers no protocol extension: it accepts the handshake and plays nothing."""
    received.append(connection.request.headers.get("Execbox-Extensions") if connection.request else None)
    connection.recv(timeout=10)


def test_a_transcript_needing_an_extension_is_skipped_on_a_runner_without_it(tmp_path: Path) -> None:
    extended = discover(select="ext-live-logs")
    assert extended and all(transcript.extensions == ("live-logs",) for transcript in extended)
    with scripted_runner(accepts_and_waits) as (url, received):
        results = run_all(url, extended)
        completed = conformance(url, "-k", "ext-live-logs", "--junit-xml", str(tmp_path / "report.xml"))
    assert received[0] == "live-logs"  # asked for at the handshake
    assert all(result.skipped and not result.passed and not result.failed for result in results)
    assert results[0].line() == f"SKIP {results[0].name}: the runner does not offer the live-logs extension"
    assert summary(results) == f"0 passed, 0 failed, {len(results)} skipped"
    report = json_report(results, url)
    assert (report["ok"], report["passed"], report["failed"], report["skipped"]) == (False, 0, 0, len(results))
    assert report["results"][0]["failure"] is None and "live-logs" in report["results"][0]["skipped"]
    assert report["results"][0]["extensions"] == ["live-logs"]
    suite = ET.fromstring(junit_xml(results, url)).find("testsuite")
    assert suite is not None and suite.get("skipped") == str(len(results)) and suite.get("failures") == "0"
    assert len(suite.findall("testcase/skipped")) == len(results)
    assert completed.returncode == 2 and "every selected transcript needs a protocol extension" in completed.stderr


def test_the_extension_transcripts_pass_on_this_runner(runner_url: str) -> None:
    completed = conformance(runner_url, "-k", "ext-", "-k", "spec-minimal-success")
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "SKIP" not in completed.stdout and "4 passed, 0 failed" in completed.stdout


def test_an_extensions_header_must_name_extensions(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"transcript": "bad", "extensions": "live-logs"}\n{"sleep_ms": 1}\n')
    with pytest.raises(TranscriptError, match="extensions must be a list"):
        load_transcript(bad)


def test_a_transcript_in_a_later_format_is_refused_not_misread(tmp_path: Path) -> None:
    later = tmp_path / "later.jsonl"
    later.write_text('{"transcript": "later", "format": 2}\n{"sleep_ms": 1}\n')
    with pytest.raises(
        TranscriptError, match=r"in transcript format 2, newer than 1: upgrade execbox-runner to read it$"
    ):
        load_transcript(later)
    for bad in ('"1"', "0", "true", "1.5"):
        later.write_text(f'{{"transcript": "later", "format": {bad}}}\n{{"sleep_ms": 1}}\n')
        with pytest.raises(TranscriptError, match="format must be a positive integer"):
            load_transcript(later)
    later.write_text('{"transcript": "now", "format": 1}\n{"sleep_ms": 1}\n')
    assert load_transcript(later).name == "now"
