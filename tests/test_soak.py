"""The soak as a test: ``pytest -m stress`` (CI runs it after the suite), for a minute by default.

A longer or other run: ``pytest -m stress tests/test_soak.py --soak-seconds 600 --soak-seed 7
--soak-clients 64 --soak-daemon-arg=--profile=hardened``; ``--soak-tenants 3`` spreads the clients
over three tenants (a tokens file), whose guests then take turns within their shares of the CPU. The figures are printed; only a broken
invariant fails it (``tests/soak/``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from .daemonkit import running_daemon
from .soak.mix import SESSIONS
from .soak.run import Settings, soak

WARM_UP_S = 1.0  # for the daemon's warm workers to start


@pytest.mark.stress
def test_soak(request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    option = request.config.getoption
    kinds = sorted(filter(None, str(option("--soak-kinds")).split(","))) or sorted(SESSIONS)
    if unknown := set(kinds) - set(SESSIONS):
        raise pytest.UsageError(f"unknown --soak-kinds {sorted(unknown)}; known: {','.join(sorted(SESSIONS))}")
    settings = Settings(
        duration_s=option("--soak-seconds"),
        clients=option("--soak-clients"),
        sentinels=option("--soak-sentinels"),
        seed=option("--soak-seed"),
        kinds=kinds,
        tokens=tuple(f"soak-token-{index}" for index in range(option("--soak-tenants"))),
    )

    def say(line: str) -> None:
        with capsys.disabled():
            print(line, flush=True)

    tokens = tmp_path / "tokens"
    tokens.write_text("".join(f"{token} tenant=t{index}\n" for index, token in enumerate(settings.tokens)))
    tenants = ["--tokens-file", str(tokens)] if settings.tokens else []
    with running_daemon("--processes", "0", *tenants, *option("--soak-daemon-arg")) as daemon:
        time.sleep(WARM_UP_S)
        tally = soak(daemon.url, daemon.process.pid, settings, say)
    assert tally.violations == 0, "\n".join(tally.described)
    assert sum(tally.sessions.values()) > settings.clients, "the soak ran too few sessions to mean anything"
