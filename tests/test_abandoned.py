"""An execution its host gave up on costs nothing to its neighbours: a host that resets right
after ``started`` (its Run perhaps never sent to the worker) must not get the worker retired as
'slow to let go' and later killed with the executions parked in it (found by the soak)."""

from __future__ import annotations

import json
import socket
import struct
import time

from .daemonkit import client, execute, receive, running_daemon

ABANDON_GRACE_S = 2.5  # server.ABANDON_GRACE_S: when a worker that has not let go is retired


def test_hosts_that_reset_after_started_cost_the_worker_and_its_neighbours_nothing() -> None:
    with running_daemon("--warm-workers", "1") as d:
        with client(d.url) as parked:
            parked.send(execute("parked", "(await tools.echo({v: 1})).v", timeoutMs=60_000))
            assert receive(parked)["type"] == "started"
            call = receive(parked)
            for index in range(8):
                with client(d.url) as gone:
                    gone.send(execute(f"gone-{index}", "while (true) {}", timeoutMs=30_000))
                    assert receive(gone)["type"] == "started"
                    # A reset, not a closing handshake: the daemon learns at once, mid-start.
                    gone.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    gone.socket.close()
            time.sleep(ABANDON_GRACE_S + 1.0)  # past the grace a worker gets to let go
            parked.send(
                json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": call["input"]})
            )
            done = receive(parked)
            assert done["type"] == "done" and done["ok"] and done["result"] == 1
        lines = d.json_lines(until=lambda lines: any(line.get("execution_id") == "parked" for line in lines))
        assert not [line for line in lines if "has not let go" in line["message"]]
        assert not [line for line in lines if line.get("exit_reason") in {"slow_abort", "stuck"}]
