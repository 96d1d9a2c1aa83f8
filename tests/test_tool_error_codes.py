"""Host error codes over a real socket: one outside the stable set is tool_error to the guest and in
the log; a stable one (timeout too) reaches the done uncaught with the host's own message."""

from __future__ import annotations

import json

from websockets.sync.client import ClientConnection

from .daemonkit import client, execute, receive, running_daemon


def fail_next_tool_call(ws: ClientConnection, code: str, message: str) -> None:
    call = receive(ws)
    assert call["type"] == "tool_call"
    ws.send(
        json.dumps(
            {"type": "tool_result", "callId": call["callId"], "ok": False, "error": {"code": code, "message": message}}
        )
    )


def test_unknown_host_code_rejects_the_guest_promise_and_is_logged() -> None:
    with running_daemon() as d:
        with client(d.url) as ws:
            caught = "try { await tools.hang({}) } catch (e) { return [e.code, e.message] }"
            ws.send(execute("caught", caught))
            assert receive(ws)["type"] == "started"
            fail_next_tool_call(ws, "not_found", "no such page")
            done = receive(ws)
            assert (done["ok"], done["result"]) == (True, ["tool_error", "no such page"])

            ws.send(execute("uncaught", "await tools.hang({})"))
            assert receive(ws)["type"] == "started"
            fail_next_tool_call(ws, "rate_limited", "slow down")
            assert receive(ws)["error"] == {"code": "tool_error", "message": "slow down"}
        lines = d.json_lines(until=lambda lines: sum("execution_id" in line for line in lines) >= 2)
    executions = {line["execution_id"]: line for line in lines if line.get("logger") == "execbox_runner.executions"}
    assert executions["caught"]["unknown_tool_error_codes"] == ["not_found"]
    assert executions["uncaught"]["unknown_tool_error_codes"] == ["rate_limited"]
    assert executions["uncaught"]["error_code"] == "tool_error"


def test_an_uncaught_host_timeout_keeps_the_hosts_message() -> None:
    """Found through execbox's host: a tool failing with ``timeout`` read "Execution timed out"."""
    with running_daemon() as d, client(d.url) as ws:
        ws.send(execute("upstream", "await tools.hang({})"))
        assert receive(ws)["type"] == "started"
        fail_next_tool_call(ws, "timeout", "upstream timed out")
        assert receive(ws)["error"] == {"code": "timeout", "message": "upstream timed out"}
        ws.send(execute("own", "while (true) {}", timeoutMs=200))  # the runner's own deadline
        assert receive(ws)["type"] == "started"
        assert receive(ws)["error"] == {"code": "timeout", "message": "Execution timed out"}
