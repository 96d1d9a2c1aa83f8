"""The command line as a user meets it: what each command takes, says and exits with.

Every command follows one scheme of exit statuses: 0 ok; 1 the execution or the
run failed (a guest error, a runner that could not be reached or went away, a
port that cannot be bound, a difference); 2 a usage or configuration error (a
bad flag or value, a missing file, a runner that refused the request as
invalid). Each case runs the real command in a subprocess, against a real daemon
where one is needed.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.server import ServerConnection

from execbox_runner.client.cli import is_javascript, looks_like_a_path, read_code
from execbox_runner.daemon import config, startup

from .daemonkit import Daemon, certificate, running_daemon, scripted_runner, stop
from .test_deploy import free_port
from .test_examples import first_line

REPO = Path(__file__).resolve().parent.parent
TRANSCRIPT = REPO / "transcripts" / "code-last-expression.jsonl"
TOKEN = "cli-token"
CLIENT_VARIABLES = ("EXECBOX_URL", "EXECBOX_TOKEN", "EXECBOX_CONFORMANCE_TOKEN")


def run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``execbox-runner ARGV`` with none of this environment's runner variables."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(config.ENV_PREFIX) and name not in CLIENT_VARIABLES
    }
    return subprocess.run(
        [sys.executable, "-m", "execbox_runner", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environment, **(env or {})},
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


def one_line(result: subprocess.CompletedProcess[str], status: int, expected: str) -> None:
    """The command exited with ``status`` and said why in one line on stderr, and nothing on stdout."""
    assert result.returncode == status, result.stderr
    assert result.stdout == "", result.stdout
    assert result.stderr.count("\n") == 1 and expected in result.stderr, result.stderr


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon("--tokens", TOKEN, "--max-timeout-ms", "60000") as started:
        yield started


# ---------------------------------------------------------------- exec: code or file


@pytest.mark.parametrize(
    ("argument", "path"),
    [
        ("./does-not-exist.js", True),
        ("guest.mjs", True),
        ("lib/x.cjs", True),
        ("types.ts", True),
        ("../up/guest", True),
        ("/tmp/no-such-guest", True),  # a regex /tmp/ with the flags no-such-guest would be no JavaScript
        ("/usr/bin/env", True),
        ("~/guest", True),
        ("~/bin/script", True),
        ('/x/.test("x")', False),  # a regex, called
        ("/a/g", False),  # a regex with a flag JavaScript has
        ("6 * 7", False),
        ("x.length", False),
        ("await f('a.js')", False),  # more than one word
        ("-", False),
    ],
)
def test_when_code_or_file_is_taken_for_a_path(argument: str, path: bool) -> None:
    assert looks_like_a_path(argument) is path


def test_is_javascript_checks_regular_expression_flags() -> None:
    assert is_javascript("/x/gimsuy") and is_javascript("/x/dv")
    assert not is_javascript("/x/gg") and not is_javascript("/x/uv") and not is_javascript("/tmp/x")


def test_an_existing_file_is_read_whatever_its_name(tmp_path: Path) -> None:
    odd = tmp_path / "no suffix, spaces"
    odd.write_text("6 * 7")
    assert read_code(str(odd)) == "6 * 7"


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    one_line(
        run("exec", "./does-not-exist.js", cwd=tmp_path),
        2,
        "execbox-runner exec: cannot read ./does-not-exist.js: No such file or directory",
    )
    one_line(run("exec", str(tmp_path)), 2, f"cannot read {tmp_path}: Is a directory")


def test_code_that_looks_like_a_path_but_is_javascript_runs(daemon: Daemon) -> None:
    done = run("exec", '/x/.test("x")', "--url", daemon.url, "--token", TOKEN)
    assert (done.returncode, done.stdout, done.stderr) == (0, "true\n", "")


def test_a_file_and_stdin(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "guest.js").write_text("console.log('from a file'); 6 * 7\n")
    done = run("exec", "./guest.js", "--url", daemon.url, "--token", TOKEN, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "from a file\n")
    piped = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "exec", "-", "--url", daemon.url, "--token", TOKEN],
        input="[1, 2].length",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (piped.returncode, piped.stdout) == (0, "2\n")


def test_code_that_is_not_utf8_is_one_line_and_exit_2(tmp_path: Path) -> None:
    (tmp_path / "bin.js").write_bytes(b"\xff\xfe1")
    one_line(run("exec", "bin.js", cwd=tmp_path), 2, "execbox-runner exec: cannot read bin.js: not UTF-8 text")
    piped = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "exec", "-"], input=b"\xff\xfe1", capture_output=True, timeout=120
    )
    one_line(
        subprocess.CompletedProcess(piped.args, piped.returncode, piped.stdout.decode(), piped.stderr.decode()),
        2,
        "execbox-runner exec: cannot read stdin: not UTF-8 text",
    )
    # An argument's bytes that do not decode reach Python as surrogates (os.fsencode gives them back).
    one_line(run("exec", '"\udcff"'), 2, "execbox-runner exec: the code is not UTF-8 text")


# ---------------------------------------------------------------- exec: values and exit statuses


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--timeout-ms", "0"], "argument --timeout-ms: must be a number of milliseconds > 0"),
        (["--timeout-ms", "-5"], "must be a number of milliseconds > 0"),
        (["--timeout-ms", "soon"], "must be a number of milliseconds > 0"),
        (["--timeout-ms", "nan"], "must be a number of milliseconds > 0"),
        (["--timeout-ms", "1e300"], "and <= 9007199254740991"),
        (["--no-such-flag"], "execbox-runner exec: error: unrecognized arguments: --no-such-flag (see --help)"),
        (["--url", "http://127.0.0.1:1/"], "not a ws:// or wss:// URL"),
    ],
)
def test_a_bad_value_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    one_line(run("exec", "1", *args), 2, expected)


def test_limits_the_runner_refuses_are_a_usage_error_with_its_message(daemon: Daemon) -> None:
    one_line(
        run("exec", "1", "--timeout-ms", "999999999", "--url", daemon.url, "--token", TOKEN),
        2,
        "execbox-runner exec: the runner refused the execution (validation_error): "
        "timeoutMs 999999999 exceeds this runner's maximum of 60000",
    )


def test_exit_statuses_of_exec(daemon: Daemon) -> None:
    connect = ("--url", daemon.url, "--token", TOKEN)
    ok = run("exec", "console.log('hi'); ({a: 1})", *connect)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, '{"a": 1}\n', "hi\n")
    guest = run("exec", "throw new Error('no')", *connect)
    assert (guest.returncode, guest.stdout, guest.stderr) == (1, "", "error: runtime_error: no\n")
    timeout = run("exec", "while (true) {}", "--timeout-ms", "100", *connect)
    assert timeout.returncode == 1 and timeout.stderr.startswith("error: timeout: ")
    one_line(
        run("exec", "1", "--url", daemon.url, "--token", "wrong"), 2, "refused the WebSocket handshake with HTTP 401"
    )
    unreachable = f"ws://127.0.0.1:{free_port()}/"
    one_line(run("exec", "1", "--url", unreachable), 1, f"cannot connect to {unreachable}: connection refused")


def test_exec_refused_at_a_quota_exits_1_as_busy_not_2(tmp_path: Path) -> None:
    """A 429 passes with time, as a 503 does: a script that retries on 1 and gives up on 2 (a usage
    error, which no retry mends) must retry it."""
    (tmp_path / "tokens").write_text("quota-token tenant=t executions_per_minute=1\n")
    with running_daemon("--tokens-file", str(tmp_path / "tokens")) as d:
        connect = ("--url", d.url, "--token", "quota-token")
        assert run("exec", "1", *connect).returncode == 0
        one_line(run("exec", "1", *connect), 1, "refused the WebSocket handshake with HTTP 429")


def test_the_first_errors_a_newcomer_meets_say_what_to_do(daemon: Daemon) -> None:
    """No token, a wrong token, no runner at the URL: each line ends with the way out."""
    one_line(
        run("exec", "1", "--url", daemon.url),
        2,
        "HTTP 401: exactly one Authorization header with a valid bearer token is required; this runner needs a"
        " token: give it with --token or $EXECBOX_RUNNER_TOKEN\n",
    )
    wrong = "token is required; the token given is not one this runner accepts\n"
    one_line(run("exec", "1", "--url", daemon.url, "--token", "wrong"), 2, wrong)
    one_line(run("replay", str(TRANSCRIPT), "--url", daemon.url, "--token", "wrong"), 2, wrong)
    port = free_port()
    nothing = (
        f"connection refused (nothing listens on 127.0.0.1:{port}); start a runner there with 'execbox-runner serve'"
    )
    one_line(
        run("exec", "1", "--url", f"ws://127.0.0.1:{port}/"), 1, f"{nothing}, or give no URL to run on a private one\n"
    )
    one_line(run("replay", str(TRANSCRIPT), "--url", f"ws://127.0.0.1:{port}/"), 1, f"{nothing}\n")


def test_the_private_runner_takes_a_timeout_above_a_daemons_default_maximum() -> None:
    """Without --url the runner is exec's own: a budget above serve's default maximum (300 s) runs."""
    done = run("exec", "6 * 7", "--timeout-ms", "600000")
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")


def test_ctrl_c_cancels_the_execution_on_the_runner_and_exits_1_in_one_line() -> None:
    """SIGINT mid-execution: the runner is told to cancel (its execution ends long before its own
    timeout), and exec says so in one line with status 1, not a traceback."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith(config.ENV_PREFIX)}
    code = "console.log('spinning'); while (true) {}"
    with running_daemon("--max-timeout-ms", "600000") as d:
        process = subprocess.Popen(
            [sys.executable, "-m", "execbox_runner", "exec", "--url", d.url, "--timeout-ms", "600000", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        try:
            lines: queue.Queue[str] = queue.Queue()
            stderr = process.stderr
            assert stderr is not None
            threading.Thread(target=lambda: lines.put(stderr.readline()), daemon=True).start()
            assert lines.get(timeout=60) == "spinning\n"  # a live log: the guest is running
            process.send_signal(signal.SIGINT)
            stdout, rest = process.communicate(timeout=60)
        finally:
            stop(process, signal.SIGKILL)
        assert (process.returncode, stdout, rest) == (
            1,
            "",
            "execbox-runner exec: interrupted: the execution was cancelled\n",
        )
        # The execution ended (a cancel's done is a timeout), not left to its ten minutes.
        ended = d.json_lines(lambda lines: any("error_code" in line for line in lines))
        assert [line["error_code"] for line in ended if "error_code" in line] == ["timeout"]


def test_a_wss_url_to_a_plain_runner_names_the_reason(daemon: Daemon) -> None:
    secure = daemon.url.replace("ws://", "wss://")
    one_line(
        run("exec", "1", "--url", secure, "--token", TOKEN),
        1,
        f"cannot connect to {secure}: TLS handshake failed: ",
    )
    assert "(is the runner serving plain ws://?)" in run("exec", "1", "--url", secure).stderr


# ---------------------------------------------------------------- environment variables


@pytest.mark.parametrize("token", ["a\nb", "a b", "\udcff"], ids=["line break", "space", "not UTF-8"])
@pytest.mark.parametrize("command", ["exec", "replay"])
def test_a_token_a_header_cannot_carry_is_one_line_and_exit_2(daemon: Daemon, command: str, token: str) -> None:
    argv = [command, "1" if command == "exec" else str(TRANSCRIPT), "--url", daemon.url]
    expected = "the token must be printable ASCII without spaces, and not empty"
    one_line(run(*argv, "--token", token), 2, expected)
    one_line(run(*argv, env={"EXECBOX_RUNNER_TOKEN": token}), 2, expected)


def test_a_token_the_runner_does_not_know_is_refused_by_it(daemon: Daemon) -> None:
    one_line(run("exec", "1", "--url", daemon.url, "--token", "not-one-of-its-tokens"), 2, "401")


def test_clients_read_execbox_runner_url_and_token(daemon: Daemon) -> None:
    done = run("exec", "6 * 7", env={"EXECBOX_RUNNER_URL": daemon.url, "EXECBOX_RUNNER_TOKEN": TOKEN})
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")
    wrong = {"EXECBOX_RUNNER_URL": daemon.url, "EXECBOX_RUNNER_TOKEN": "wrong"}
    one_line(run("exec", "1", env=wrong), 2, f"{daemon.url} refused the WebSocket handshake with HTTP 401")
    flags_win = run("exec", "1", "--token", TOKEN, env=wrong)
    assert flags_win.returncode == 0, flags_win.stderr


def test_the_old_names_are_read_with_a_warning_naming_the_new_one(daemon: Daemon) -> None:
    done = run("exec", "6 * 7", env={"EXECBOX_URL": daemon.url, "EXECBOX_TOKEN": TOKEN})
    assert (done.returncode, done.stdout) == (0, "42\n")
    assert done.stderr.splitlines() == [
        "execbox-runner exec: warning: EXECBOX_URL is deprecated; set EXECBOX_RUNNER_URL instead",
        "execbox-runner exec: warning: EXECBOX_TOKEN is deprecated; set EXECBOX_RUNNER_TOKEN instead",
    ]
    new_wins = run("exec", "1", env={"EXECBOX_RUNNER_URL": daemon.url, "EXECBOX_URL": "ws://127.0.0.1:1/"})
    assert "EXECBOX_URL" not in new_wins.stderr


# ---------------------------------------------------------------- replay


def test_exit_statuses_of_replay(daemon: Daemon, tmp_path: Path) -> None:
    passed = run("replay", str(TRANSCRIPT), env={"EXECBOX_RUNNER_URL": daemon.url, "EXECBOX_RUNNER_TOKEN": TOKEN})
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.splitlines()[-1] == "1 passed, 0 failed"
    doctored = tmp_path / "doctored.jsonl"
    doctored.write_text(TRANSCRIPT.read_text().replace('"result": 42', '"result": 43'))
    differs = run("replay", str(doctored), "--url", daemon.url, "--token", TOKEN)
    assert differs.returncode == 1 and "0 passed, 1 failed" in differs.stdout
    one_line(run("replay", str(tmp_path / "missing.jsonl"), "--url", daemon.url), 2, "missing.jsonl")
    summary = tmp_path / "20260101T000000.000000-x.summary.json"  # what `replay records/*` also names
    summary.write_text(json.dumps({"transcript": "20260101T000000.000000-x.jsonl", "executions": []}, indent=2))
    one_line(run("replay", str(summary), "--url", daemon.url), 2, "a session's summary, not its transcript")
    one_line(run("replay", str(TRANSCRIPT), "--url", daemon.url), 2, "refused the WebSocket handshake with HTTP 401")
    one_line(run("replay", str(TRANSCRIPT)), 2, "give the runner's URL: --url or $EXECBOX_RUNNER_URL")
    one_line(run("replay", str(TRANSCRIPT), "--url", daemon.url, "--timeout", "0"), 2, "must be a number of seconds")
    too_long = run("replay", str(TRANSCRIPT), "--url", daemon.url, "--timeout", "1e10")  # beyond what a wait can take
    one_line(too_long, 2, "argument --timeout: must be a number of seconds > 0 and <= 86400, not '1e10'")
    unreachable = f"ws://127.0.0.1:{free_port()}/"
    one_line(run("replay", str(TRANSCRIPT), "--url", unreachable), 1, "connection refused")


def test_replay_of_a_session_the_runner_cannot_replay_is_not_a_success() -> None:
    """A record that used live logs, against a runner without them: skipped, and status 1, since
    the session was not replayed (`0` says every session replayed as recorded)."""
    live = REPO / "transcripts" / "ext-live-logs-stream.jsonl"

    def accepts_and_waits(connection: ServerConnection, received: list[Any]) -> None:
        connection.recv(timeout=10)

    with scripted_runner(accepts_and_waits) as (url, _):
        skipped = run("replay", str(live), "--url", url)
    assert skipped.returncode == 1, skipped.stderr
    assert skipped.stdout.splitlines()[-1] == "0 passed, 0 failed, 1 skipped"
    assert "the runner does not offer the live-logs extension" in skipped.stdout


# ---------------------------------------------------------------- mcp


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--port", "70000"], "argument --port: must be a port number 0-65535, not '70000'"),
        (["--timeout-ms", "0"], "argument --timeout-ms: must be a number of milliseconds > 0"),
        (["--memory-limit-bytes", "1.5"], "argument --memory-limit-bytes: must be an integer > 0"),
        (["--max-tool-calls", "0"], "argument --max-tool-calls: must be an integer > 0"),
        (["--max-result-chars", "-1"], "argument --max-result-chars: must be an integer > 0"),
        (["--startup-timeout", "inf"], "argument --startup-timeout: must be a number of seconds > 0"),
    ],
)
def test_mcp_checks_its_numbers_in_one_line(tmp_path: Path, args: list[str], expected: str) -> None:
    servers = tmp_path / "servers.json"
    servers.write_text('{"mcpServers": {}}')
    one_line(run("mcp", "--config", str(servers), *args), 2, expected)


def test_exit_statuses_of_mcp(tmp_path: Path) -> None:
    one_line(run("mcp", "--config", str(tmp_path / "none.json")), 2, "cannot read")
    failing = tmp_path / "failing.json"
    failing.write_text(json.dumps({"mcpServers": {"x": {"command": str(tmp_path / "no-such-command")}}}))
    one_line(run("mcp", "--config", str(failing), "--url", "ws://127.0.0.1:1/"), 1, "MCP server 'x' did not start")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"mcpServers": {}}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ("mcp", "--config", str(empty), "--url", "ws://127.0.0.1:1/", "--transport", "http", "--port", str(port))
        done = run(*argv)
    taken_line = f"cannot serve on 127.0.0.1:{port}: Address already in use (another process listens there: stop it,"
    one_line(done, 1, f"execbox-runner mcp: {taken_line} or choose another port)\n")


# ---------------------------------------------------------------- info and the start-up line


def test_info_shows_the_limits_and_the_engine() -> None:
    done = run("info", "--max-sessions", "12", "--max-workers", "3", "--memory-budget-bytes", str(3 << 30))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    engine = next(line for line in lines if line.startswith("engine: "))
    assert engine.startswith("engine: quickjs-ng ")
    assert engine.endswith(("(tuned build of deploy/quickjs/build.py)", "(stock wheel from PyPI)"))
    for expected in (
        "  max sessions           12",
        "  max workers            3 (2 started ahead)",
        "  worker capacity        2048 executions at once per worker",
        "  max timeoutMs          300000 (300 s)",
        "  max memoryLimitBytes   536870912 (512 MiB)",
        "  memory budget          3.0 GiB",
        "  max message            16 MiB",
        "  max output             16 MiB",
        "  timeouts               idle 60 s, handshake 10 s, send 10 s, close 2 s, drain grace 25 s",
    ):
        assert expected in lines, done.stdout
    assert "  worker capacity        1 executions at once per worker" in run("info", "--profile", "hardened").stdout
    report = json.loads(run("info", "--json").stdout)
    assert report["engine"] == engine.removeprefix("engine: ")
    assert report["limits"]["worker_capacity"] == 2048 and report["timeouts_s"]["idle"] == 60.0


def test_info_refuses_a_record_dir_serve_would_refuse_and_makes_none(tmp_path: Path) -> None:
    """A ``--record-dir`` under a file: ``info`` exits 2 with ``serve``'s line. One that does not
    exist yet is fine for both, and ``info``, which starts nothing, does not make it."""
    (tmp_path / "a-file").write_text("")
    unusable = str(tmp_path / "a-file" / "records")
    expected = f"execbox-runner: cannot use --record-dir {unusable}: Not a directory\n"
    for command in ("info", "serve"):
        refused = run(command, "--port", "0", "--record-dir", unusable)
        one_line(refused, 2, expected)
        assert refused.stderr == expected
    assert run("info", "--record-dir", str(tmp_path / "new" / "records")).returncode == 0
    assert not (tmp_path / "new").exists()


def test_the_start_up_lines_name_the_engine_and_the_listening_line_ends_with_the_url() -> None:
    engine = json.loads(run("info", "--json").stdout)["engine"]
    with running_daemon() as d:
        (logged,) = [line for line in d.json_lines() if line["message"].startswith("execbox-runner ")]
    assert logged["engine"] == engine and f"; engine {engine}; " in logged["message"]
    serve = subprocess.Popen(
        [sys.executable, "-m", "execbox_runner", "serve", "--port", "0", "--processes", "1", "--log-level", "WARNING"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = first_line(serve)
    finally:
        stop(serve)
        assert serve.stdout is not None
        serve.stdout.close()
    assert re.fullmatch(rf"execbox-runner with {re.escape(engine)} listening on ws://127\.0\.0\.1:\d+/\n", line), line


# ---------------------------------------------------------------- help


COMMANDS = ["serve", "info", "exec", "mcp", "replay"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_help_has_a_description_exit_statuses_and_no_raw_defaults(command: str | None) -> None:
    done = run(*([command] if command else []), "--help")
    assert done.returncode == 0 and done.stderr == ""
    text = done.stdout
    assert "\nexit status:\n  0  " in text and "\n  2  a usage or configuration error: " in text
    for raw in ("default False", "default True", "default )", "default: )", "default: None"):
        assert raw not in text


def test_serve_help_groups_the_settings_with_real_defaults() -> None:
    text = run("serve", "--help", env={"COLUMNS": "120"}).stdout
    titles = [title for title, _ in config.GROUPS]
    assert [text.index(f"\n{title}:\n") for title in titles] == sorted(text.index(f"\n{title}:\n") for title in titles)
    assert text.splitlines()[0] == "usage: execbox-runner serve [--config FILE] [--SETTING VALUE ...]"
    flat = " ".join(text.split())
    for fact in (
        "a boolean: true/1/yes/false/0/no; default: true; env EXECBOX_RUNNER_SANDBOX",
        "default: false; env EXECBOX_RUNNER_ALLOW_UNAUTHENTICATED",
        "default: none; env EXECBOX_RUNNER_TOKENS_FILE",
        "default: the usable cores, 2 to 8; env EXECBOX_RUNNER_WARM_WORKERS",
        "default: 16777216 (16 MiB); env EXECBOX_RUNNER_MAX_MESSAGE_BYTES",
        "default: 300000 (300 s); env EXECBOX_RUNNER_MAX_TIMEOUT_MS",
        "default: 0.01 s; env EXECBOX_RUNNER_CANCEL_GRACE",
    ):
        assert fact in flat, fact


def test_every_setting_is_in_exactly_one_group_and_has_a_default_text() -> None:
    grouped = [name for _, names in config.GROUPS for name in names]
    assert sorted(grouped) == sorted(config.HELP) and len(grouped) == len(set(grouped))
    assert (config.default_text("sandbox"), config.default_text("log_guest_code")) == ("true", "false")
    assert (config.default_text("certfile"), config.default_text("allowed_origins")) == ("none", "empty (no Origin)")
    assert config.default_text("max_memory_limit_bytes") == "536870912 (512 MiB)"
    assert (config.default_text("port"), config.default_text("idle_timeout")) == ("8765", "60 s")


# ---------------------------------------------------------------- TLS reasons of the command line


def test_a_ws_url_to_a_tls_runner_names_the_reason(tmp_path: Path) -> None:
    certfile, keyfile, trusted = certificate(tmp_path)
    with running_daemon("--certfile", str(certfile), "--keyfile", str(keyfile)) as d:
        plain = d.url.replace("wss://", "ws://")
        one_line(
            run("exec", "1", "--url", plain),
            1,
            "closed the connection during the handshake (is the runner serving wss://?)",
        )
        advice = "; to trust the certificate authority that signed it, set SSL_CERT_FILE to its PEM file\n"
        one_line(run("exec", "1", "--url", d.url), 1, "TLS certificate verification failed: ")
        one_line(run("exec", "1", "--url", d.url), 1, advice)
        # Following the advice works.
        authority = tmp_path / "ca.pem"
        authority.write_text("".join(ssl.DER_cert_to_PEM_cert(der) for der in trusted.get_ca_certs(binary_form=True)))
        done = run("exec", "6 * 7", "--url", d.url, env={"SSL_CERT_FILE": str(authority)})
        assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")


def test_the_engine_is_named_by_its_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(startup.native, "NATIVE_BUDGET", False)
    monkeypatch.setattr(startup.importlib.metadata, "version", lambda name: "0.17.0.2")
    assert startup.engine() == "quickjs-ng 0.17.0.2 (stock wheel from PyPI)"
    monkeypatch.setattr(startup.native, "NATIVE_BUDGET", True)
    monkeypatch.setattr(startup.importlib.metadata, "version", lambda name: "0.17.0.2+arena2048.budget.clock")
    assert startup.engine() == "quickjs-ng 0.17.0.2+arena2048.budget.clock (tuned build of deploy/quickjs/build.py)"
