"""Fair shares between tenants: each active tenant computes on its weight's part of the machine,
whatever the number of its executions (``tenants.shares``, ``pool/sharing.py``), judged by the CPU
each tenant's workers spent. What that leaves another tenant's executions in latency is measured by
``benchmarks/tenants.py``, not asserted here (the suite times nothing)."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execbox_runner.client import Runner
from execbox_runner.daemon.machine import usable_cores
from execbox_runner.daemon.pool.sharing import ACTIVE_S, Sharing
from execbox_runner.daemon.tenants import Tenant, read_tenants, shares
from execbox_runner.protocol import ipc

from .daemonkit import Daemon, client, run_to_done, running_daemon

TOKENS = "token-a tenant=a\ntoken-b tenant=b\n"
SPIN_MS = 3000


def test_shares_split_the_cores_by_weight_and_leave_a_lone_tenant_alone() -> None:
    assert shares({"a": 1}, 8) == {}
    assert shares({"a": 1, "b": 1}, 8) == {"a": 4, "b": 4}
    assert shares({"a": 1, "b": 3}, 8) == {"a": 2, "b": 6}
    assert shares({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 1}  # at least one each


class FakeWorker:
    """What ``Sharing`` reads and drives of a worker."""

    def __init__(self, tenant: str, leases: int) -> None:
        self.tenant, self.alive, self.idle_since, self.share = tenant, True, -100.0, 0
        self.leases = dict.fromkeys(range(leases))
        self.sent: list[ipc.ToWorker] = []

    def send(self, slot: int, message: ipc.ToWorker) -> None:
        assert slot == 0
        self.sent.append(message)


def test_the_pool_tells_each_active_tenants_workers_its_part_and_only_when_it_changes() -> None:
    weights = {"heavy": 3, "light": 1, "idle": 1}
    sharing = Sharing(lambda names: shares({name: weights[name] for name in names}, 8))
    heavy = [FakeWorker("heavy", 1), FakeWorker("heavy", 1)]
    light, idle = FakeWorker("light", 1), FakeWorker("idle", 0)  # idle: no execution for long
    workers = [*heavy, light, idle]
    sharing.share_out(workers, now=0.0)  # type: ignore[arg-type]
    assert sharing.active == {"heavy", "light"}
    assert [w.sent for w in workers] == [[ipc.Share(3)], [ipc.Share(3)], [ipc.Share(2)], []]  # 6 split, 2
    sharing.share_out(workers, now=0.5)  # type: ignore[arg-type]
    assert [len(w.sent) for w in workers] == [1, 1, 1, 0]  # nothing changed, nothing sent
    light.leases.clear()
    light.idle_since = 0.5
    sharing.share_out(workers, now=0.5 + ACTIVE_S)  # type: ignore[arg-type]
    assert sharing.active == {"heavy"} and heavy[0].sent[-1] == light.sent[-1] == ipc.Share(0)  # alone


def test_the_tokens_file_sets_a_weight(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text("t1 tenant=a weight=3\nt2 tenant=a\nt3 tenant=b\n")
    tenants = dict(read_tenants("", str(path)))
    assert tenants[b"t1"] == tenants[b"t2"] == Tenant("a", weight=3) and tenants[b"t3"] == Tenant("b")
    path.write_text("t1 tenant=a weight=0\n")
    with pytest.raises(ValueError, match="weight must be a whole number of at least 1"):
        read_tenants("", str(path))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    path = tmp_path_factory.mktemp("shares") / "tokens"
    path.write_text(TOKENS)
    # More runner threads than the default, so that without shares the many spinners of one
    # tenant would take far more than its half on a machine of any size.
    with running_daemon("--tokens-file", str(path), "--worker-threads", "32") as started:
        yield started


def tenant_cpu(daemon: Daemon, token: str = "token-a") -> dict[str, float]:
    """``execbox_tenant_cpu_seconds_total`` by tenant (``token``: any the daemon accepts)."""
    host, port = daemon.url.removeprefix("ws://").rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {token}"})
    text = connection.getresponse().read().decode()
    connection.close()
    return {
        line.split('tenant="', 1)[1].split('"', 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("execbox_tenant_cpu_seconds_total{")
    }


def spin(url: str, token: str, exec_id: str, outcomes: list[str]) -> None:
    with client(url, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        done = run_to_done(ws, exec_id, "while (true) {}", timeoutMs=SPIN_MS)
        outcomes.append(done["error"]["code"])


def test_a_tenant_with_many_spinning_guests_takes_no_more_than_its_share(daemon: Daemon) -> None:
    """Tenant a spins 32 guests, and half a second later tenant b one per core: from then on
    each gets about half of the CPU (without shares, a would keep 32 runner threads' worth to b's
    few). A's guests already computing as b arrives are held to its share too."""
    assert Runner.connect(daemon.url, token="token-b").execute_sync("1").ok  # b's worker is started
    time.sleep(ACTIVE_S + 0.5)  # and b is no longer active: a starts alone
    before = tenant_cpu(daemon)
    outcomes: list[str] = []
    threads = [threading.Thread(target=spin, args=(daemon.url, "token-a", f"a{i}", outcomes)) for i in range(32)]
    cores = usable_cores()
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    threads += [threading.Thread(target=spin, args=(daemon.url, "token-b", f"b{i}", outcomes)) for i in range(cores)]
    for thread in threads[32:]:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert outcomes == ["timeout"] * len(threads)
    time.sleep(1.5)  # the daemon reads its workers' CPU once a second
    after = tenant_cpu(daemon)
    a, b = (after[name] - before.get(name, 0.0) for name in ("a", "b"))
    # About 0.45 (a was alone at first), 0.27 beside two busy loops; without shares 0.1.
    assert b / (a + b) > 0.2, (a, b)


def test_a_heavier_tenant_gets_more_of_a_busy_machine(tmp_path: Path) -> None:
    """Weights 3 and 1, both tenants spinning more guests than there are cores: the heavier one's
    guests get more of the CPU (3:1 of the cores, in whole guests: 2 against 1 on 2 cores)."""
    path = tmp_path / "tokens"
    path.write_text("token-h tenant=heavy weight=3\ntoken-l tenant=light\n")
    spinners = 2 * usable_cores() + 2
    with running_daemon("--tokens-file", str(path), "--worker-threads", str(2 * spinners)) as started:
        for token in ("token-h", "token-l"):  # both active, their workers started
            assert Runner.connect(started.url, token=token).execute_sync("1").ok
        before = tenant_cpu(started, "token-h")
        outcomes: list[str] = []
        threads = [
            threading.Thread(target=spin, args=(started.url, token, f"{token}-{i}", outcomes))
            for i in range(spinners)
            for token in ("token-h", "token-l")
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert outcomes == ["timeout"] * len(threads)
        time.sleep(1.5)  # the daemon reads its workers' CPU once a second
        after = tenant_cpu(started, "token-h")
    heavy, light = (after[name] - before.get(name, 0.0) for name in ("heavy", "light"))
    # About 1.5 on 2 cores (2 guests against 1: the kernel places 3 threads on 2 cores unevenly),
    # 3 on a machine of 4 or more; equal weights give 1.
    assert heavy > 1.2 * light, (heavy, light)
