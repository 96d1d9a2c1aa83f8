"""The Python examples run as a user would run them, with what each needs started here."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

from .daemonkit import running_daemon, stop

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_agent_loop_recovers_from_a_rejected_tool_input() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent_loop.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "function get_price(input: {" in done.stdout
    assert "turn 1: error validation_error: Invalid input for tool get_price" in done.stdout
    assert 'answer: [{"name": "desk lamp", "price": 42.12}]' in done.stdout


def test_remote_service_against_a_daemon_with_tokens() -> None:
    with running_daemon("--tokens", "service-token") as daemon:
        environment = {**os.environ, "EXECBOX_URL": daemon.url, "EXECBOX_TOKEN": "service-token"}
        service = subprocess.Popen(
            [sys.executable, str(EXAMPLES / "remote_service.py"), "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=environment,
        )
        try:
            base = first_line(service).removeprefix("remote_service listening on ").strip()
            with urllib.request.urlopen(base + "types", timeout=30) as response:
                assert "function status(input: {\n    order_id: string;\n  }): Promise<{" in response.read().decode()
            code = "const ids = await orders.open_orders(); console.log(ids.length); (await orders.status({order_id: ids[0]})).total"
            assert post(base + "run", {"code": code}) == {"ok": True, "result": 90.0, "error": None, "logs": ["1"]}
            missing = post(base + "run", {"code": "await orders.status({order_id: 'Z-9'})"})
            assert missing["error"] == {"code": "validation_error", "message": "no order Z-9"}
        finally:
            stop(service)
            assert service.stdout is not None
            service.stdout.close()


def first_line(process: subprocess.Popen[str]) -> str:
    """The process's first stdout line, waited for on a thread so the wait is bounded."""
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    stdout = process.stdout
    threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
    return lines.get(timeout=60)


def post(url: str, value: Any) -> Any:
    request = urllib.request.Request(url, data=json.dumps(value).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())
