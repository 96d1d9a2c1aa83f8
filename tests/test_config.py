"""Settings: flags, environment variables and the TOML file, in that order of precedence."""

from __future__ import annotations

from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus

from execbox_runner import cli
from execbox_runner.daemon import config

from .daemonkit import client, run_to_done, running_daemon
from .test_dashboards import scrape
from .test_operations import metric


def settings(*argv: str, environ: dict[str, str] | None = None) -> config.Settings:
    return config.resolve(cli.build_parser().parse_args(["serve", *argv]), environ or {})


def test_flags_beat_environment_which_beats_the_file_which_beats_defaults(tmp_path: Path) -> None:
    file = tmp_path / "runner.toml"
    file.write_text('max-sessions = 7\nidle_timeout = 5\nprofile = "hardened"\nsandbox = false\n')
    resolved = settings("--config", str(file), "--idle-timeout", "9", environ={"EXECBOX_RUNNER_MAX_SESSIONS": "11"})
    assert (resolved.max_sessions, resolved.idle_timeout, resolved.profile, resolved.sandbox) == (
        11,
        9.0,
        "hardened",
        False,
    )
    assert settings().max_sessions == config.Settings().max_sessions
    assert settings(environ={"EXECBOX_RUNNER_CONFIG": str(file)}).profile == "hardened"


def test_the_daemon_runs_with_a_config_file(tmp_path: Path) -> None:
    file = tmp_path / "runner.toml"
    file.write_text("max_sessions = 1\n")
    with running_daemon("--config", str(file)) as d, client(d.url) as ws:
        with pytest.raises(InvalidStatus):
            client(d.url)
        assert run_to_done(ws, "cfg", "5")["result"] == 5
        assert metric(scrape(d.url), "execbox_max_sessions") == 1
