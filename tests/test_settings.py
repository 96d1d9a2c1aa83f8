"""Settings that cannot be wrong silently, unsafe settings that are loud, and the second signal.

Misconfigurations run the real command line in a subprocess: each must exit 2
with one line on stderr, for ``serve`` and ``info`` alike.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from execbox_runner.daemon import config, report, supervisor
from execbox_runner.daemon.report import UNSAFE_SETTINGS

from .daemonkit import (
    Daemon,
    certificate,
    children_of,
    client,
    execute,
    process_state,
    receive,
    run_to_done,
    running_daemon,
)
from .test_config import settings
from .test_operations import metric
from .test_supervisor import tree

COMMAND_TIMEOUT_S = 60
LOG_WAIT_S = 30.0


def run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(config.ENV_PREFIX)}
    return subprocess.run(
        [sys.executable, "-m", "execbox_runner", *argv],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        env={**environment, **(env or {})},
        cwd=cwd,
    )


def refused_with_one_line(result: subprocess.CompletedProcess[str], expected: str) -> None:
    lines = result.stderr.splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("execbox-runner") and expected in lines[0], result.stderr
    assert result.stdout == ""


UNSENDABLE = "the token must be printable ASCII without spaces, and not empty"


MISCONFIGURATIONS = [
    (["--port", "70000"], "invalid --port '70000': must be a port number 0-65535"),
    (["--port", "-1"], "must be a port number 0-65535"),
    (["--port", "http"], "must be a port number"),
    (["--processes", "-1"], "invalid --processes '-1': must be an integer >= 0"),
    (["--processes", "100000"], "invalid --processes '100000': must be an integer >= 0 and <= 256"),
    (["--max-sessions", "-5"], "must be an integer >= 0"),
    (["--memory-budget-bytes", "-1"], "must be an integer >= 0"),
    (["--max-executions-per-worker", "-1"], "must be an integer >= 0"),
    (["--max-workers", "0"], "invalid --max-workers '0': must be an integer > 0"),
    (["--worker-capacity", "0"], "must be an integer > 0"),
    (["--worker-threads", "0"], "must be an integer > 0"),
    (["--worker-threads", "16384"], "invalid --worker-threads '16384': must be an integer > 0 and <= 1024"),
    (["--max-message-bytes", "0"], "must be an integer >= 4096"),
    (["--max-message-bytes", "4095"], "invalid --max-message-bytes '4095': must be an integer >= 4096"),
    (["--max-output-bytes", "1.5"], "must be an integer >= 1024"),
    (["--max-output-bytes", "100"], "invalid --max-output-bytes '100': must be an integer >= 1024"),
    (["--max-timeout-ms", "0"], "must be an integer > 0"),
    (["--max-memory-limit-bytes", "1e9"], "must be an integer > 0"),
    (["--idle-timeout", "0"], "invalid --idle-timeout '0': must be a number of seconds > 0"),
    (["--send-timeout", "-1"], "must be a number of seconds > 0"),
    (["--handshake-timeout", "soon"], "must be a number of seconds > 0"),
    (["--close-timeout", "nan"], "must be a number of seconds > 0"),
    (["--drain-grace", "inf"], "must be a number of seconds >= 0"),
    (["--cancel-grace", "-0.1"], "must be a number of seconds >= 0"),
    (["--sandbox", "maybe"], "invalid --sandbox 'maybe': must be a boolean: true/1/yes/false/0/no"),
    (["--sandbox", "off"], "must be a boolean"),
    (["--log-guest-code", "2"], "must be a boolean"),
    (["--profile", "fast"], "invalid --profile 'fast': must be one of standard, hardened"),
    (["--log-level", "verbose"], "must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    (["--log-format", "xml"], "must be one of json, text"),
    (["--host", " "], "invalid --host ' ': must not be empty"),
    (
        ["--tokens-file", "/nonexistent/tokens"],
        "invalid --tokens-file '/nonexistent/tokens': No such file or directory",
    ),
    (["--certfile", "/nonexistent/cert.pem"], "No such file or directory"),
    (["--tokens-file", "/"], "not a regular file"),
    (["--keyfile", "/nonexistent/key.pem"], "--keyfile needs --certfile"),
    (["--config", "/nonexistent/runner.toml"], "cannot read config file /nonexistent/runner.toml"),
    (["--record-dir", "/etc/hostname"], "exists and is not a directory"),
    (["--record-dir", "/sys/kernel"], "cannot use --record-dir /sys/kernel: "),  # a directory no one may write
    (["--warm-workers", "5", "--max-workers", "2"], "--warm-workers 5 exceeds --max-workers 2"),
    (["--tokens", "a,b,a"], "invalid --tokens (tokens not shown): one token given twice (a token is one tenant's)"),
    # Origins no browser sends, which would refuse every page: a path, upper case, a default port, a pattern.
    (["--allowed-origins", "https://app.example/"], "'https://app.example/' must be SCHEME://HOST[:PORT] as browsers"),
    (["--allowed-origins", "https://a.example,https://App.example"], "'https://App.example' must be SCHEME://HOST"),
    (["--allowed-origins", "https://app.example:443"], "'https://app.example:443' must be SCHEME://HOST[:PORT]"),
    (["--allowed-origins", "*"], "invalid --allowed-origins '*': '*' must be SCHEME://HOST[:PORT]"),
    (["--no-such-flag"], "execbox-runner serve: error: unrecognized arguments: --no-such-flag (see --help)"),
    (["--port"], "expected one argument"),
]


@pytest.mark.parametrize(("args", "expected"), MISCONFIGURATIONS, ids=[" ".join(a) for a, _ in MISCONFIGURATIONS])
def test_each_misconfiguration_of_serve_exits_2_with_one_line(args: list[str], expected: str) -> None:
    refused_with_one_line(run("serve", *args), expected)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--port", "70000"], "must be a port number"),
        (["--sandbox", "on"], "must be a boolean"),
        (["--host", "0.0.0.0"], "refusing to serve 0.0.0.0 without authentication: configure --tokens-file"),
    ],
)
def test_info_refuses_the_same_way(args: list[str], expected: str) -> None:
    refused_with_one_line(run("info", *args), expected)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("PORT", "99999", "invalid EXECBOX_RUNNER_PORT '99999': must be a port number"),
        ("SANDBOX", "off", "invalid EXECBOX_RUNNER_SANDBOX 'off': must be a boolean"),
        ("IDLE_TIMEOUT", "-3", "must be a number of seconds > 0"),
        ("PROFILE", "fast", "invalid EXECBOX_RUNNER_PROFILE 'fast': must be one of standard, hardened"),
        ("CONFIG", "/nonexistent.toml", "cannot read config file"),
    ],
)
def test_environment_variables_are_checked_like_flags(variable: str, value: str, expected: str) -> None:
    refused_with_one_line(run("serve", env={config.ENV_PREFIX + variable: value}), expected)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("port = 70000", "port = 70000: must be a port number 0-65535"),
        ("idle_timeout = -1", "idle_timeout = -1: must be a number of seconds > 0"),
        ("max_sessions = 1.5", "must be an integer >= 0"),
        ("sandbox = 0", "sandbox = 0: must be a TOML boolean: true or false"),
        ('sandbox = "on"', "sandbox = 'on': must be a boolean: true/1/yes/false/0/no"),  # a string: a flag's words
        ('certfile = "/nonexistent/cert.pem"', "certfile = '/nonexistent/cert.pem': No such file or directory"),
        ("surprise = true", "unknown setting 'surprise'"),
        ("max-sessions = 5\nmax_sessions = 7", "'max-sessions' and 'max_sessions' are one setting, given twice"),
        ('profile = "fast"', "profile = 'fast': must be one of standard, hardened"),
        ('max_sessions = "x"', "max_sessions = 'x': must be an integer >= 0"),
        ("[broken", "cannot read config file"),
    ],
)
def test_toml_keys_are_checked_like_flags(tmp_path: Path, content: str, expected: str) -> None:
    file = tmp_path / "runner.toml"
    file.write_text(content + "\n")
    refused_with_one_line(run("serve", "--config", str(file)), expected)


@pytest.mark.parametrize("command", ["serve", "info"])
@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("--config", "cannot read config file {file}: not UTF-8 text"),
        ("EXECBOX_RUNNER_CONFIG", "cannot read config file {file}: not UTF-8 text"),
        ("--tokens-file", "invalid --tokens-file '{file}': not UTF-8 text"),
        ("--metrics-token-file", "invalid --metrics-token-file '{file}': not UTF-8 text"),
    ],
)
def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path, command: str, how: str, expected: str) -> None:
    file = tmp_path / "latin1"
    file.write_bytes(b"port = 1\n# caf\xe9\n")
    given = (["--metrics-port", "9999"] if how == "--metrics-token-file" else []) + [how, str(file)]
    result = run(command, env={how: str(file)}) if how.startswith(config.ENV_PREFIX) else run(command, *given)
    refused_with_one_line(result, expected.format(file=file))


@pytest.mark.parametrize("command", ["serve", "info"])
@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", "holds no token (it would leave sessions open to anyone who reaches the port)"),
        ("# tokens to come\n\n", "holds no token"),
        ("a tenant=x\nb\na tenant=y\n", "line 3: the token of line 1 again (a token is one tenant's)"),
        ("good tenant=x\nsecret\ttenant=y\n", "line 2: " + UNSENDABLE),
        ("good\ns\u00e9cret\n", "line 2: " + UNSENDABLE),
    ],
    ids=["empty", "comments only", "a token twice", "a tab for a space", "not ASCII"],
)
def test_a_tokens_file_without_tokens_or_with_one_twice_is_refused(
    tmp_path: Path, command: str, content: str, expected: str
) -> None:
    file = tmp_path / "tokens.txt"
    file.write_text(content)
    refused_with_one_line(run(command, "--host", "0.0.0.0", "--tokens-file", str(file)), expected)


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("--tokens", "invalid --tokens (tokens not shown): holds a token no client could send"),
        ("--metrics-token", "invalid --metrics-token (tokens not shown): holds a token no client could send"),
        ("EXECBOX_RUNNER_TOKENS", "invalid EXECBOX_RUNNER_TOKENS (tokens not shown): holds a token no client"),
        ("--config", "tokens = (tokens not shown): holds a token no client could send"),
        ("--metrics-token-file", "metrics-tokens': line 2: " + UNSENDABLE),
    ],
)
def test_a_token_no_client_could_send_is_refused_without_showing_it(tmp_path: Path, where: str, expected: str) -> None:
    """Every client sends printable ASCII without spaces: a daemon accepting another token would let
    no one in with it. The error quotes no token (it reaches logs and terminals)."""
    token = "se cret"
    args, env = [where, f"fine,{token}"], {}
    if where == "EXECBOX_RUNNER_TOKENS":
        args, env = [], {where: token}
    elif where == "--config":
        (tmp_path / "runner.toml").write_text(f"tokens = '{token}'\n")
        args = [where, str(tmp_path / "runner.toml")]
    elif where == "--metrics-token-file":
        (tmp_path / "metrics-tokens").write_text(f"fine\n{token}\n")
        args = [where, str(tmp_path / "metrics-tokens")]
    result = run("serve", *args, env=env)
    refused_with_one_line(result, expected)
    assert UNSENDABLE in result.stderr and "cret" not in result.stderr


@pytest.mark.parametrize("command", ["serve", "info"])
@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["--certfile", "junk.pem"], "--certfile junk.pem holds no PEM certificate"),
        (["--certfile", "tls.crt"], "--certfile tls.crt (no --keyfile) holds no PEM private key"),
        (["--certfile", "tls.crt", "--keyfile", "junk.pem"], "--keyfile junk.pem holds no PEM private key"),
        (
            ["--certfile", "tls.crt", "--keyfile", "other/tls.key"],
            "the private key of --keyfile other/tls.key does not match the certificate of --certfile tls.crt",
        ),
    ],
    ids=["not a certificate", "no key", "a keyfile without a key", "another certificate's key"],
)
def test_a_certificate_serve_cannot_use_is_one_line_naming_the_file(
    tmp_path: Path, command: str, files: list[str], expected: str
) -> None:
    certificate(tmp_path)
    (tmp_path / "other").mkdir()
    certificate(tmp_path / "other")
    (tmp_path / "junk.pem").write_text("not PEM\n")
    refused_with_one_line(run(command, *files, cwd=tmp_path), expected)


@pytest.mark.parametrize(
    ("word", "value"),
    [("true", True), ("TRUE", True), ("1", True), ("Yes", True), ("false", False), ("0", False), ("NO", False)],
)
def test_booleans_are_six_words_in_any_case(word: str, value: bool) -> None:
    assert settings("--sandbox", word).sandbox is value


def test_zero_means_auto_or_never_where_the_help_says_so() -> None:
    resolved = settings(
        *("--port", "0", "--processes", "0", "--max-sessions", "0", "--memory-budget-bytes", "0"),
        *("--max-executions-per-worker", "0", "--warm-workers", "0", "--drain-grace", "0", "--cancel-grace", "0"),
    )
    assert (resolved.port, resolved.processes, resolved.max_sessions, resolved.drain_grace) == (0, 0, 0, 0.0)
    assert resolved.max_executions_per_worker == resolved.memory_budget_bytes == resolved.warm_workers == 0
    out = run("serve", "--help").stdout
    for meaning in (
        "0: one per two usable cores",
        "0: never",
        "0: sized from memory",
        "0: 80 percent",
        "0 picks a free port",
    ):
        assert meaning in " ".join(out.split())


def test_no_warm_workers_means_none_in_every_daemon_process_and_executions_still_run() -> None:
    shard = supervisor.shard_arguments(config.Settings(warm_workers=0), 2, 8765)
    assert shard[shard.index("--warm-workers") + 1] == "0"
    with running_daemon("--warm-workers", "0") as d, client(d.url) as ws:
        assert run_to_done(ws, "cold", "6 * 7")["result"] == 42


def test_choices_are_case_insensitive_and_a_lower_max_workers_lowers_the_default_warm_workers() -> None:
    resolved = settings("--profile", "HARDENED", "--log-level", "debug", "--max-workers", "1")
    assert (resolved.profile, resolved.log_level, resolved.warm_workers) == ("hardened", "DEBUG", 1)


# ------------------------------------------------------------------ unsafe settings


def get_json(daemon: Daemon, path: str) -> dict[str, Any]:
    host, port = daemon.url.removeprefix("ws://").strip("/").rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path)
        body = connection.getresponse().read()
    finally:
        connection.close()
    return json.loads(body) if path != "/metrics" else {"text": body.decode()}


def warnings_logged(daemon: Daemon) -> list[str]:
    lines = [json.loads(line) for line in daemon.log_lines() if line.startswith("{")]
    return [line["unsafe_setting"] for line in lines if line["level"] == "warning" and "unsafe_setting" in line]


def test_unsafe_settings_are_a_warning_a_healthz_field_and_a_metric() -> None:
    with running_daemon("--sandbox", "no") as d:
        assert get_json(d, "/healthz")["unsafe_settings"] == ["sandbox_off", "no_authentication"]
        text = get_json(d, "/metrics")["text"]
        assert warnings_logged(d) == ["sandbox_off", "no_authentication"]
    assert metric(text, "execbox_unsafe_settings", setting="sandbox_off") == 1
    assert metric(text, "execbox_unsafe_settings", setting="no_authentication") == 1
    for safe in ("no_tls", "no_network_namespace"):
        assert f'execbox_unsafe_settings{{setting="{safe}"}} 0.0' in text


def test_variables_nothing_reads_and_the_clients_token_are_warned_of_not_refused() -> None:
    """A misspelt setting, or the clients' EXECBOX_RUNNER_TOKEN meant as the daemon's, would
    otherwise go unnoticed; the clients' and code mode's own variables may share the environment."""
    env = {"EXECBOX_RUNNER_MAX_SESIONS": "5", "EXECBOX_RUNNER_TOKEN": "abc", "EXECBOX_RUNNER_URL": "ws://x/"}
    info = run("info", env=env)
    assert info.returncode == 0
    assert info.stderr.splitlines() == [
        "execbox-runner: warning: EXECBOX_RUNNER_MAX_SESIONS is not a setting and is not read"
        " (see execbox-runner serve --help)",
        "execbox-runner: warning: EXECBOX_RUNNER_TOKEN is the clients' token and is not read here: the daemon's"
        " tokens are EXECBOX_RUNNER_TOKENS or EXECBOX_RUNNER_TOKENS_FILE (--tokens, --tokens-file)",
    ]
    with running_daemon(env={"EXECBOX_RUNNER_MAX_SESIONS": "5"}) as d:
        logged = [json.loads(line) for line in d.log_lines() if line.startswith("{")]
    assert any(line["level"] == "warning" and "EXECBOX_RUNNER_MAX_SESIONS" in line["message"] for line in logged)


def test_a_runner_with_tokens_and_the_sandbox_reports_nothing_unsafe(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("secret\n")
    with running_daemon("--tokens-file", str(tokens)) as d:
        unsafe = get_json(d, "/healthz")["unsafe_settings"]
        assert warnings_logged(d) == unsafe
    # This host may not give workers a network namespace; nothing else may be unsafe.
    assert unsafe in ([], ["no_network_namespace"])


def test_max_sessions_above_what_the_descriptor_limit_carries_is_warned_of() -> None:
    """Under a hard limit of 1024 descriptors, 2000 sessions in one daemon process cannot all be
    open (each is a socket): ``info`` says so and how to mend it; 700 fit, and so do 2000 shared by
    three processes (667 each). The default, sized from the limit, always fits."""

    def warnings(*args: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "execbox_runner", "info", "--json", *args],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)),
            check=True,
        )
        found: list[str] = json.loads(done.stdout)["warnings"]
        return [line for line in found if "descriptor limit" in line]

    (warned,) = warnings("--max-sessions", "2000", "--processes", "1")
    assert warned == (
        "--max-sessions is more than the descriptor limit carries: 2000 sessions a daemon process, against 1024"
        " descriptors; raise the limit (LimitNOFILE, the runtime's nofile) to 2256 or more, or connections past"
        " it are shed"
    )
    assert warnings("--max-sessions", "700", "--processes", "1") == []
    assert warnings("--max-sessions", "2000", "--processes", "3") == []
    assert warnings() == []


def test_info_reports_unsafe_settings_in_json_and_text() -> None:
    args = ("--sandbox", "No", "--host", "0.0.0.0", "--allow-unauthenticated", "yes")
    report = json.loads(run("info", "--json", *args).stdout)
    assert report["unsafe_settings"] == ["sandbox_off", "no_authentication", "no_tls"]
    text = run("info", *args)
    assert text.returncode == 0
    assert f"UNSAFE no_tls: {UNSAFE_SETTINGS['no_tls']}" in text.stdout.splitlines()


def test_a_missing_network_namespace_is_unsafe_only_when_the_sandbox_asks_for_one() -> None:
    def protections(requested: bool, enforced: bool) -> dict[str, dict[str, bool]]:
        return {"network_namespace": {"requested": requested, "enforced": enforced}}

    settings = config.Settings(certfile="", host="localhost")
    assert report.unsafe_settings(settings, (b"t",), protections(True, False)) == ["no_network_namespace"]
    assert report.unsafe_settings(settings, (b"t",), protections(True, True)) == []
    off = config.Settings(sandbox=False)
    assert report.unsafe_settings(off, (b"t",), protections(False, False)) == ["sandbox_off"]


# ------------------------------------------------------------------ the second signal


def wait_for_log(daemon: Daemon, text: str, count: int) -> None:
    deadline = time.monotonic() + LOG_WAIT_S
    while sum(text in line for line in daemon.log_lines()) < count:
        assert time.monotonic() < deadline, f"no {count} log lines with {text!r}: {daemon.log_lines()[-10:]}"
        time.sleep(0.05)


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_second_sigterm_during_a_drain_stops_at_once(processes: str) -> None:
    # A drain that would last ten minutes: held open by an execution awaiting a tool.
    with running_daemon("--processes", processes, "--drain-grace", "600") as d, client(d.url) as ws:
        ws.send(execute("held", "await tools.hang({})"))
        assert [receive(ws)["type"], receive(ws)["type"]] == ["started", "tool_call"]
        d.process.send_signal(signal.SIGTERM)
        wait_for_log(d, "draining (up to 600 s", int(processes))
        d.process.send_signal(signal.SIGTERM)
        assert d.process.wait(timeout=COMMAND_TIMEOUT_S) == 1
        wait_for_log(d, "again while draining: stopping at once", 1)


@contextlib.contextmanager
def never_ready(tmp_path: Path, *args: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``serve`` whose workers can never start, once it has said one failed (then killed by PID if
    it is still there): workers cannot lower an address-space limit below their own backstop."""
    limit = 4 << 30

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    environment = {k: v for k, v in os.environ.items() if not k.startswith(config.ENV_PREFIX)}
    argv = ["serve", "--port", "0", "--log-format", "text", "--memory-budget-bytes", str(4 * limit), *args]
    log = tmp_path / "stderr"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "execbox_runner", *argv],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=environment,
            preexec_fn=limited,  # noqa: PLW1509 -- only setrlimit, before exec
        )
    try:
        deadline = time.monotonic() + LOG_WAIT_S
        while "failed to start" not in log.read_text():
            assert time.monotonic() < deadline and process.poll() is None, log.read_text()
            time.sleep(0.05)
        yield process, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()


def wait_gone(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not gone, nor a zombie) after at most ``LOG_WAIT_S``."""
    deadline = time.monotonic() + LOG_WAIT_S
    while (left := [pid for pid in pids if process_state(pid) not in ("gone", "Z")]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_signal_while_workers_keep_failing_to_start_stops_the_daemon(tmp_path: Path, processes: str) -> None:
    # The daemon (or the supervisor's first shard), never ready, replaces its workers until a
    # signal stops it: at once, every process with it, and with status 0 (nothing to drain).
    with never_ready(tmp_path, "--processes", processes) as (process, log):
        descendants = tree(process.pid)
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=COMMAND_TIMEOUT_S)
        assert process.returncode == 0, log.read_text()
        assert not wait_gone(descendants), log.read_text()
    assert out == ""
    assert log.read_text().count("received SIGTERM before the daemon was ready: stopping") == int(processes)


def test_a_worker_that_cannot_start_says_why(tmp_path: Path) -> None:
    # Its stderr is closed by then: the daemon's line carries what the worker reported.
    with never_ready(tmp_path, "--log-format", "json") as (_, log):
        failed = next(json.loads(line) for line in log.read_text().splitlines() if "failed to start" in line)
    assert failed["level"] == "warning" and failed["exit_reason"] == "exit_1"
    hard_limit = f"(hard limit {4 << 30})"
    assert (
        failed["start_failure"].startswith("OSError: cannot set RLIMIT_AS to ")
        and hard_limit in failed["start_failure"]
    )
    assert f"failed to start ({failed['start_failure']}): exited on its own with status 1" in failed["message"]


def test_a_shard_not_yet_ready_stops_when_its_supervisor_dies(tmp_path: Path) -> None:
    with never_ready(tmp_path, "--processes", "2") as (process, log):
        shards = children_of(process.pid)
        process.kill()
        process.wait()
        assert shards and not wait_gone(shards), log.read_text()
    assert "received SIGTERM before the daemon was ready: stopping" in log.read_text()
