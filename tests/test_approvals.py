"""Approval of tool calls from guest code, in the Python client against the real daemon: approve,
refuse (the guest catches a tool_error), and an execution that times out while the host asks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from execbox_runner.client import ApprovalRequest, Providers, Runner, Tool

from .daemonkit import Daemon, running_daemon

BACKENDS = ["asyncio", "trio"]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as started:
        yield started


deleted: list[str] = []


def delete(path: str) -> str:
    deleted.append(path)
    return f"deleted {path}"


def only_tmp(request: ApprovalRequest) -> bool | str:
    """Approve deleting under /tmp; refuse anything else, saying why."""
    assert (request.provider, request.tool) == ("fs", "remove")
    return True if str(request.input["path"]).startswith("/tmp/") else "only /tmp may be deleted"


CODE = """
const ok = await fs.remove({path: "/tmp/a"});
let refused;
try { await fs.remove({path: "/etc/passwd"}); } catch (e) { refused = [e.code, e.message]; }
({ok, refused})
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_approved_call_runs_and_a_refused_one_rejects_in_the_guest(backend: str, daemon: Daemon) -> None:
    deleted.clear()
    providers = {"fs": {"remove": Tool(delete, approve=only_tmp)}}
    result = anyio.run(lambda: Runner.connect(daemon.url).execute(CODE, providers), backend=backend)
    assert result.ok, result.error
    assert result.result == {
        "ok": "deleted /tmp/a",
        "refused": ["tool_error", "Tool fs.remove was not approved: only /tmp may be deleted"],
    }
    assert deleted == ["/tmp/a"]  # the refused call never ran


def test_an_async_approver_for_every_tool_of_the_providers(daemon: Daemon) -> None:
    asked: list[str] = []

    async def ask(request: ApprovalRequest) -> bool:
        asked.append(f"{request.provider}.{request.tool}")
        await anyio.sleep(0)
        return request.tool != "remove"

    providers = Providers({"fs": {"read": lambda path: f"contents of {path}", "remove": delete}}, approve=ask)
    code = "const r = await fs.read({path: 'x'}); let m; try { await fs.remove({path: 'x'}) } catch (e) { m = e.message } [r, m]"
    result = Runner.connect(daemon.url).execute_sync(code, providers)
    assert result.result == ["contents of x", "Tool fs.remove was not approved"]
    assert asked == ["fs.read", "fs.remove"]


def test_an_execution_that_times_out_while_the_host_asks_ends_as_timeout(daemon: Daemon) -> None:
    asking = threading.Event()
    answer = threading.Event()

    def slow_human(request: ApprovalRequest) -> bool:
        asking.set()
        answer.wait(30)  # a person who never answers
        return True

    providers = {"fs": {"remove": Tool(delete, approve=slow_human)}}
    deleted.clear()
    started = time.monotonic()
    try:
        result = Runner.connect(daemon.url).execute_sync("await fs.remove({path: '/tmp/x'})", providers, timeout_ms=800)
    finally:
        answer.set()
    assert asking.is_set()
    assert result.error is not None and result.error.code == "timeout"
    assert time.monotonic() - started < 10  # not the 30 s the question could have taken
    assert deleted == []
