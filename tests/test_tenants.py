"""Named tenants and their quotas: the tokens file, the 429 at the handshake (with Retry-After and
a body naming the quota) while other tenants are served, the Python client's typed error and its
opt-in retry."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus

from execbox_runner.client import QuotaExceeded, Runner
from execbox_runner.daemon.machine import cpu_seconds
from execbox_runner.daemon.tenants import Ledger, Tenant, read_tenants

from .daemonkit import Daemon, client, execute, receive, run_to_done, running_daemon, running_daemon_with_site

TOKENS = """\
# tenant names label metrics and log lines; quotas are per tenant
acme-1  tenant=acme  max_sessions=2  memory_in_flight_bytes=100000000
acme-2  tenant=acme
globex-1  tenant=globex  executions_per_minute=3
initech-1  tenant=initech  cpu_seconds_per_minute=1
plain-token
umbrella-1  tenant=umbrella  executions_per_minute=2
"""


def test_the_tokens_file_names_tenants_and_their_quotas(tmp_path: Path) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(TOKENS)
    tenants = dict(read_tenants("inline-token", str(path)))
    assert tenants[b"acme-1"] == tenants[b"acme-2"] == Tenant("acme", 2, None, 100_000_000)
    assert tenants[b"globex-1"] == Tenant("globex", executions_per_minute=3)
    assert tenants[b"inline-token"] == Tenant("token-0") and tenants[b"plain-token"] == Tenant("token-5")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("t tenant=a max_sessions=0", "max_sessions must be a whole number of at least 1"),
        ("t tenant=a sessions=3", "'sessions=3' is not tenant=NAME"),
        ("t tenant=bad/name", "tenant name 'bad/name'"),
        ("t tenant=a max_sessions=1\nu tenant=a max_sessions=2", "line 2: tenant 'a' has other settings"),
        ("a tenant=x\nb\na tenant=y", r"line 3: the token of line 1 again \(a token is one tenant's\)"),
        ("a\na", "line 2: the token of line 1 again"),
        ("t tenant=a tenant=b", "line 1: tenant is given twice"),
        ("t max_sessions=5 max_sessions=50", "line 1: max_sessions is given twice"),
    ],
)
def test_a_bad_tokens_file_names_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        read_tenants("", str(path))


def test_a_token_given_inline_and_in_the_file_is_refused(tmp_path: Path) -> None:
    """Else the inline one (no tenant, no quotas) would shadow the file's line and its quotas."""
    path = tmp_path / "tokens.txt"
    path.write_text("other\nshared tenant=acme max_sessions=1\n")
    with pytest.raises(ValueError, match=r"^line 2 of the tokens file gives one of these tokens again"):
        read_tenants("mine,shared", str(path))
    with pytest.raises(ValueError, match=r"^one token given twice"):
        read_tenants("mine,mine", "")
    assert [tenant.name for _, tenant in read_tenants("mine", str(path))] == ["token-0", "token-1", "acme"]


def test_the_ledger_refuses_past_each_quota_and_says_when_to_retry() -> None:
    ledger = Ledger([Tenant("a", executions_per_minute=2), Tenant("b", memory_in_flight_bytes=10)])
    ledger.execution_started("a", 1, 100.0)
    assert ledger.refusal("a", 100.0) is None
    ledger.execution_started("a", 1, 110.0)
    quota, wait, _ = ledger.refusal("a", 120.0) or ("", 0.0, "")
    assert quota == "executions_per_minute" and wait == pytest.approx(40.0)  # the first start leaves at 160
    assert ledger.refusal("a", 160.5) is None
    ledger.execution_started("b", 6, 0.0)
    assert ledger.refusal("b", 0.0) is None  # a session may open: 4 bytes are left
    assert ledger.refusal("b", 0.0, opening=False, memory_limit=4) is None
    assert (ledger.refusal("b", 0.0, opening=False, memory_limit=5) or ("",))[0] == "memory_in_flight_bytes"
    ledger.execution_started("b", 4, 0.0)
    assert (ledger.refusal("b", 0.0) or ("",))[0] == "memory_in_flight_bytes"
    ledger.execution_ended("b", 6)
    ledger.execution_ended("b", 4)
    assert ledger.refusal("b", 0.0) is None and ledger.refusal("nobody", 0.0) is None
    cpu = Ledger([Tenant("c", cpu_seconds_per_minute=2)])
    cpu.add_cpu("c", 1.5, 10.0)
    assert cpu.refusal("c", 10.0) is None
    cpu.add_cpu("c", 0.5, 11.0)
    assert (cpu.refusal("c", 12.0) or ("",))[0] == "cpu_seconds_per_minute"
    assert cpu.refusal("c", 70.5) is None  # the first sample has left the window


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    path = tmp_path_factory.mktemp("tenants") / "tokens.txt"
    path.write_text(TOKENS)
    with running_daemon("--tokens-file", str(path)) as started:
        yield started


def metrics(daemon: Daemon, token: str | None = None) -> str:
    """The daemon's ``/metrics`` (with ``token``, for a daemon that asks for one)."""
    host, port = daemon.url.removeprefix("ws://").rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"} if token else {})
    text = connection.getresponse().read().decode()
    connection.close()
    return text


def bearer(token: str) -> dict[str, object]:
    return {"additional_headers": {"Authorization": f"Bearer {token}"}}


def refused(url: str, token: str) -> tuple[int, dict[str, str], dict[str, object]]:
    with pytest.raises(InvalidStatus) as caught, client(url, **bearer(token)):
        pass
    response = caught.value.response
    return response.status_code, dict(response.headers.raw_items()), json.loads(response.body)


def test_a_tenant_at_its_sessions_quota_gets_429_while_others_are_served(daemon: Daemon) -> None:
    with client(daemon.url, **bearer("acme-1")), client(daemon.url, **bearer("acme-2")):
        status, headers, body = refused(daemon.url, "acme-1")
        assert status == 429 and headers["Retry-After"] == "1"
        assert body == {
            "error": "quota",
            "quota": "max_sessions",
            "tenant": "acme",
            "message": "tenant acme has its maximum of 2 sessions open",
        }
        with client(daemon.url, **bearer("plain-token")) as other:  # another tenant, at the same moment
            other.send(execute("x", "6 * 7"))
            assert receive(other)["type"] == "started" and receive(other)["result"] == 42
    with client(daemon.url, **bearer("acme-1")):  # a session closed: room again
        pass
    lines = daemon.json_lines(lambda lines: any(line.get("refusal") == "quota" for line in lines))
    (line,) = [line for line in lines if line.get("refusal") == "quota"]  # says whom it hit, and why
    assert line["tenant"] == "acme" and line["quota"] == "max_sessions"
    assert line["message"].endswith(": quota (the tenant is at one of its quotas: tenant acme, quota max_sessions)")


def test_executions_per_minute_and_the_clients_typed_error_and_retry(daemon: Daemon) -> None:
    runner = Runner.connect(daemon.url, token="globex-1")
    for _ in range(3):
        assert runner.execute_sync("1").ok
    status, headers, body = refused(daemon.url, "globex-1")
    assert status == 429 and body["quota"] == "executions_per_minute" and 1 <= int(headers["Retry-After"]) <= 60
    with pytest.raises(QuotaExceeded) as caught:
        runner.execute_sync("1")
    assert caught.value.quota == "executions_per_minute" and caught.value.retry_after is not None
    lines = daemon.json_lines(lambda lines: any(line.get("tenant") == "globex" for line in lines))
    assert any(line.get("tenant") == "globex" and line.get("outcome") == "ok" for line in lines)
    assert not any("globex-1" in json.dumps(line) for line in lines)  # the name, never the token


def test_a_session_kept_open_cannot_run_past_its_tenants_quota(daemon: Daemon) -> None:
    """Quotas hold for every execution, not only at the handshake: a host that keeps one session
    open gets, past the quota, a ``done`` with ``internal_error`` naming it (nothing started)."""
    with client(daemon.url, **bearer("umbrella-1")) as ws:
        for index in range(2):
            assert run_to_done(ws, f"within-{index}", "1")["ok"]
        ws.send(execute("past", "globalThis.ran = 1"))
        done = receive(ws)
        assert (done["type"], done["id"], done["ok"], done["error"]["code"]) == (
            "done",
            "past",
            False,
            "internal_error",
        )
        message = done["error"]["message"]
        assert message.startswith("tenant umbrella started 2 executions in the last minute: try again in ")
        assert message.endswith(" s (quota executions_per_minute)")
        ws.send(execute("bad", "1", timeoutMs=-1))  # an execute that is wrong says so first
        assert receive(ws)["error"]["code"] == "validation_error"
    assert refused(daemon.url, "umbrella-1")[2]["quota"] == "executions_per_minute"
    with client(daemon.url, **bearer("plain-token")) as other:  # another tenant's session is served
        assert run_to_done(other, "other", "2")["result"] == 2
    # Told apart from a worker's failure: its own line and metric, naming the tenant and the quota.
    lines = daemon.json_lines(lambda lines: any(line.get("execution_id") == "past" for line in lines))
    (line,) = [line for line in lines if line["message"].startswith("refused execution past ")]
    assert (line["tenant"], line["quota"], line["level"]) == ("umbrella", "executions_per_minute", "info")
    text = metrics(daemon, "acme-1")
    assert 'execbox_quota_refused_executions_total{quota="executions_per_minute",tenant="umbrella"} 1.0' in text


def test_executes_refused_at_a_quota_are_not_counted_as_the_runners_internal_errors(tmp_path: Path) -> None:
    """Their ``done`` says ``internal_error`` (the protocol's only code for it), but the metric that
    the internal-errors alert reads keeps that code for the runner's own faults: they are counted
    by tenant and quota instead."""
    path = tmp_path / "tokens.txt"
    path.write_text("busy-token tenant=busy executions_per_minute=1\n")
    with running_daemon("--tokens-file", str(path)) as started, client(started.url, **bearer("busy-token")) as ws:
        assert run_to_done(ws, "first", "1")["ok"]
        for index in range(2):
            assert run_to_done(ws, f"past-{index}", "1")["error"]["code"] == "internal_error"
        text = metrics(started)
    assert 'execbox_quota_refused_executions_total{quota="executions_per_minute",tenant="busy"} 2.0' in text
    assert 'execbox_executions_total{code="",outcome="ok"} 1.0' in text
    assert 'code="internal_error"' not in text and 'outcome="error"' not in text
    assert "execbox_execution_duration_seconds_count 1.0" in text


def test_an_execute_refused_while_one_runs_leaves_that_ones_memory_counted(daemon: Daemon) -> None:
    """A second execute on a session whose execution runs is refused, and the running one still
    holds its ``memoryLimitBytes`` against the tenant's quota: a host cannot free its quota by
    sending one."""
    with client(daemon.url, **bearer("acme-1")) as first, client(daemon.url, **bearer("acme-2")) as second:
        first.send(execute("big", "await new Promise(() => {})", memoryLimitBytes=100_000_000))
        assert receive(first)["type"] == "started"
        first.send(execute("again", "1"))
        assert receive(first)["error"]["code"] == "internal_error"  # another execution is active
        second.send(execute("more", "1"))
        done = receive(second)
        assert (done["id"], done["ok"], done["error"]["code"]) == ("more", False, "internal_error")
        assert done["error"]["message"].endswith(" s (quota memory_in_flight_bytes)")


def test_the_memory_quota_bounds_the_sum_of_the_running_executions(daemon: Daemon) -> None:
    """``memory_in_flight_bytes`` (100 MB for acme) counts the execute's own ``memoryLimitBytes``: 60 MB
    running leaves no room for another 60 MB, which is refused naming both, but room for 40 MB."""
    with client(daemon.url, **bearer("acme-1")) as first, client(daemon.url, **bearer("acme-2")) as second:
        first.send(execute("held", "await new Promise(() => {})", memoryLimitBytes=60_000_000))
        assert receive(first)["type"] == "started"
        second.send(execute("past", "1", memoryLimitBytes=60_000_000))
        done = receive(second)
        assert (done["id"], done["ok"], done["error"]["code"]) == ("past", False, "internal_error")
        assert done["error"]["message"].startswith(
            "tenant acme's running executions hold 60000000 of its 100000000 bytes, and this execution asks for 60000000"
        )
        assert run_to_done(second, "fits", "6 * 7", memoryLimitBytes=40_000_000)["result"] == 42
    assert 'execbox_quota_refused_executions_total{quota="memory_in_flight_bytes",tenant="acme"}' in metrics(daemon)


def test_tenant_settings_left_without_effect_are_warned_of(tmp_path: Path) -> None:
    """A CPU quota with shared workers, a weight with shared workers or the hardened profile: the
    tokens file is accepted, and ``info`` and ``serve`` say which settings will do nothing."""
    path = tmp_path / "tokens.txt"
    path.write_text("a tenant=heavy weight=3 cpu_seconds_per_minute=5\nb tenant=light\n")

    def warnings(*flags: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "execbox_runner", "info", "--json", "--tokens-file", str(path), *flags],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return [line for line in json.loads(done.stdout)["warnings"] if "tenant" in line]

    assert warnings() == []
    cpu = "tenant heavy's cpu_seconds_per_minute counts nothing with --share-workers-across-tokens true"
    weight = "tenant heavy's weight has no effect: fair shares need tenants' own workers of the standard profile"
    shared = warnings("--share-workers-across-tokens", "true")
    assert len(shared) == 2 and shared[0].startswith(cpu) and shared[1].startswith(weight)
    (hardened,) = warnings("--profile", "hardened")
    assert hardened.startswith(weight)
    with running_daemon("--tokens-file", str(path), "--share-workers-across-tokens", "true") as started:
        lines = started.json_lines(lambda lines: any("weight has no effect" in line["message"] for line in lines))
    logged = [line for line in lines if line["message"].startswith("tenant heavy's ")]
    assert [line["level"] for line in logged] == ["warning", "warning"]
    assert logged[0]["message"].startswith(cpu) and logged[1]["message"].startswith(weight)


def test_a_retrying_client_waits_for_a_session_to_free_up(daemon: Daemon) -> None:
    with client(daemon.url, **bearer("acme-1")), client(daemon.url, **bearer("acme-2")) as second:
        release = threading.Timer(1.5, second.close)
        release.start()
        started = time.monotonic()
        try:
            result = Runner.connect(daemon.url, token="acme-1", retries=10).execute_sync("'in'")
        finally:
            release.cancel()
    assert result.result == "in" and time.monotonic() - started >= 1.0  # it waited, then got in


def test_metrics_count_each_tenants_executions_by_name(daemon: Daemon) -> None:
    Runner.connect(daemon.url, token="plain-token").execute_sync("1")
    assert Runner.connect(daemon.url, token="acme-2").execute_sync("throw 1").error is not None
    text = metrics(daemon, "acme-1")
    assert 'execbox_tenant_executions_total{outcome="ok",tenant="token-4"}' in text
    assert 'execbox_tenant_executions_total{outcome="error",tenant="acme"}' in text
    assert "acme-1" not in text and "plain-token" not in text


def test_a_tenant_whose_guests_spent_its_cpu_minute_gets_429(daemon: Daemon) -> None:
    # The guest spins until the tenant's next connection is refused: however long its worker, at its
    # lowered priority on a loaded machine, takes to spend the quota's second of CPU.
    with client(daemon.url, **bearer("initech-1")) as spinning:
        spinning.send(execute("spin", "while (true) {}", timeoutMs=120_000))
        assert receive(spinning)["type"] == "started"
        deadline = time.monotonic() + 60  # the workers' CPU is read once a second
        while time.monotonic() < deadline:
            try:
                with client(daemon.url, **bearer("initech-1")):
                    pass
            except InvalidStatus as exc:
                body = json.loads(exc.response.body)
                assert exc.response.status_code == 429 and body["quota"] == "cpu_seconds_per_minute", body
                break
            time.sleep(0.2)
        else:
            pytest.fail("no 429 within 60 s of spinning against a quota of 1 s of CPU a minute")
        spinning.send(json.dumps({"type": "cancel", "id": "spin"}))
        done = receive(spinning)
        assert (done["type"], done["error"]["code"]) == ("done", "timeout")
    assert Runner.connect(daemon.url, token="acme-1").execute_sync("1").ok  # others are served


# The daemon's look at every tenant's workers made hourly: only the look at a stopping worker counts.
RARE_CPU_LOOKS = textwrap.dedent(
    """
    import os

    if os.environ.get("EXECBOX_TEST_RARE_CPU_LOOKS"):
        from execbox_runner.daemon import server

        server.CPU_SAMPLE_INTERVAL_S = 3600.0
    """
)


def tenant_cpu_seconds(daemon: Daemon) -> float:
    """``execbox_tenant_cpu_seconds_total`` of the one tenant, ``token-0``, that has spent any."""
    text = metrics(daemon)
    (sample,) = [line for line in text.splitlines() if line.startswith("execbox_tenant_cpu_seconds_total{")]
    assert sample.startswith('execbox_tenant_cpu_seconds_total{tenant="token-0"} ')
    return float(sample.split()[-1])


SPIN_200_MS = "const end = Date.now() + 200; while (Date.now() < end) {}"


def test_a_worker_stopped_after_its_execution_has_its_cpu_counted(tmp_path: Path) -> None:
    """In ``hardened`` each execution's worker stops as it ends, within the second between the
    daemon's looks at the tenants' workers: what it spent is counted as it exits, so its guest's CPU
    counts for the tenant (its metric, its CPU quota) rather than vanishing with the process."""
    flag = "EXECBOX_TEST_RARE_CPU_LOOKS"
    with running_daemon_with_site(tmp_path, RARE_CPU_LOOKS, flag, "--profile", "hardened", "--tokens", "t") as d:
        with client(d.url, additional_headers={"Authorization": "Bearer t"}) as ws:
            for index in range(3):
                done = run_to_done(ws, f"spin-{index}", SPIN_200_MS)
                assert done["ok"], done
        assert tenant_cpu_seconds(d) > 0


def test_a_worker_that_dies_has_what_it_spent_counted(tmp_path: Path) -> None:
    """A worker killed under its tenant's guests (the OOM killer, a crash) has its CPU counted all
    the same, from what its zygote learned reaping it: a guest cannot spend CPU past the tenant's
    quota by having its worker die before the daemon's next look."""
    flag = "EXECBOX_TEST_RARE_CPU_LOOKS"
    args = ("--warm-workers", "1", "--max-workers", "1", "--tokens", "t")
    with running_daemon_with_site(tmp_path, RARE_CPU_LOOKS, flag, *args) as d:
        with client(d.url, additional_headers={"Authorization": "Bearer t"}) as ws:
            for index in range(3):  # CPU however loaded the machine: a count, not a time
                assert run_to_done(ws, f"count-{index}", "let n = 0; for (let i = 0; i < 2e7; i++) n += i; n")["ok"]
            (worker,) = d.workers()
            ws.send(execute("hang", "await new Promise(() => {})"))
            assert receive(ws)["type"] == "started"
            spent = cpu_seconds(worker)
            os.kill(worker, signal.SIGKILL)  # a worker of the daemon this test started
            done = receive(ws)
            assert (done["type"], done["ok"]) == ("done", False)
        assert spent is not None and spent > 0.05  # /proc's clock ticks: the counts took more than a few
        assert tenant_cpu_seconds(d) >= spent  # not only the ticks /proc showed: wait4's microseconds
