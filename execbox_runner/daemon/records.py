"""Session records: each session's full transcript, replayable against any runner.

With ``--record-dir``, every session is written as JSONL in the format of
``transcripts/`` (see ``transcripts/README.md``), so ``execbox-runner replay``
(the conformance harness) can play its host side against a runner and report
any difference. Values that legitimately differ between runs are written as
placeholders: ``durationMs`` as ``<number>``, and each ``callId`` as
``<bind:eKcN>`` (call N of execution K, a fresh name, so it binds whatever
the runner chooses; the host's uses of it refer to the same name). Pauses of the
host longer than ``PAUSE_MS`` become ``sleep_ms`` steps, so a cancel that came
while the guest was busy comes while it is busy again. Beside each transcript,
``.summary.json`` lists the session's executions.
"""

from __future__ import annotations

import base64
import json
import re
import time
from pathlib import Path
from typing import Any, Final

from ..protocol.session import ExecutionEnded

PAUSE_MS: Final = 10
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")


class Recorder:
    """Collects one session's steps; ``write`` saves them when the session ends."""

    def __init__(self, directory: Path, peer: str) -> None:
        self.directory = directory
        self.peer = peer
        self.started = time.time()
        self.steps: list[dict[str, Any]] = []
        self.executions: list[dict[str, Any]] = []
        self._calls: dict[str, str] = {}  # actual callId -> placeholder name, this execution
        self._execution = 0
        self._last = time.monotonic()

    def host_text(self, data: bytes) -> None:
        self._pause()
        try:
            message = json.loads(data)
        except ValueError:
            self.steps.append({"host_raw": data.decode(errors="replace")})
            return
        if isinstance(message, dict) and isinstance(message.get("callId"), str) and message["callId"] in self._calls:
            message["callId"] = f"<bind:{self._calls[message['callId']]}>"
        self.steps.append({"host": message})

    def host_binary(self, data: bytes) -> None:
        self._pause()
        self.steps.append({"host_binary": {"base64": base64.b64encode(data).decode()}})

    def runner(self, data: bytes) -> None:
        message = json.loads(data)
        if "durationMs" in message:
            message["durationMs"] = "<number>"
        if message.get("type") == "started":
            self._execution += 1
            self._calls = {}  # callIds are unique within an execution only
        if message.get("type") == "tool_call":
            name = f"e{self._execution}c{len(self._calls) + 1}"
            self._calls[message["callId"]] = name
            message["callId"] = f"<bind:{name}>"
        self.steps.append({"runner": message})
        self._last = time.monotonic()

    def host_close(self) -> None:
        self.steps.append({"host_close": True})

    def runner_close(self, code: int) -> None:
        self.steps.append({"runner_close": {"code": code}})

    def execution_ended(self, record: ExecutionEnded) -> None:
        self.executions.append(
            {
                "id": record.id,
                "outcome": record.outcome,
                "code": record.code,
                "duration_ms": round(record.duration_s * 1000, 3),
                "tool_calls": record.tool_calls,
            }
        )

    def _pause(self) -> None:
        now = time.monotonic()
        waited = round((now - self._last) * 1000)
        if waited > PAUSE_MS and self.steps:
            self.steps.append({"sleep_ms": waited})
        self._last = now

    def write(self) -> Path | None:
        """Save the transcript and its summary; None for a session that sent nothing."""
        if not self.steps:
            return None
        first = next((e["id"] for e in self.executions), "session")
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.started)) + f"{self.started % 1:.6f}"[1:]
        name = _UNSAFE.sub("_", f"{stamp}-{first}")[:120]
        path = self.directory / f"{name}.jsonl"
        header = {"transcript": name, "description": f"recorded session from {self.peer} at {stamp}"}
        path.write_text("".join(json.dumps(line) + "\n" for line in [header, *self.steps]))
        summary = {"transcript": path.name, "peer": self.peer, "started": self.started, "executions": self.executions}
        path.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return path
