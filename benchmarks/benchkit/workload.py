"""What the benchmark asks the daemon to run, and the host messages that carry it.

Both clients (latency and load) build their messages here, so they send the
same bytes and their figures compare.
"""

from __future__ import annotations

import json
from typing import Any, Final

OPTIONS: Final[dict[str, int]] = {
    "timeoutMs": 5000,
    "memoryLimitBytes": 67108864,
    "maxLogLines": 100,
    "maxLogChars": 64000,
}
THROUGHPUT_CODE: Final = "1+1"


def providers(*tools: str) -> list[dict[str, Any]]:
    """One provider manifest, ``tools``, offering the named tools (answered by the client)."""
    return [{"name": "tools", "tools": {n: {"safeName": n, "originalName": n} for n in tools}, "types": ""}]


PROVIDERS: Final = providers("echo")


def tool_code(n: int) -> str:
    """Guest code making ``n`` sequential ``tools.echo`` calls; returns the sum of echoed ``i``."""
    return f"let n = 0; for (let i = 0; i < {n}; i++) {{ const r = await tools.echo({{ i }}); n += r.i; }} n"


# A program as models write them in code mode: a few tool calls, some data shaping, a log line and
# a final expression (what a real execution's code costs to normalize, where ``tool_code`` is short).
MODEL_PROGRAM: Final = """const users = await tools.listUsers({ limit: 50 });
const active = users.filter(u => u.active);
const details = await Promise.all(active.map(u => tools.getUser({ id: u.id })));
let total = 0;
for (const d of details) {
  if (d.orders && d.orders.length > 0) {
    total += d.orders.reduce((s, o) => s + o.amount, 0);
  }
}
console.log('users', active.length);
({ count: active.length, total, top: details.sort((a, b) => b.score - a.score).slice(0, 5).map(d => d.name) })
"""


def execute_message(
    exec_id: str, code: str, options: dict[str, int] = OPTIONS, manifest: list[dict[str, Any]] = PROVIDERS
) -> bytes:
    """The spec's ``execute`` message as JSON text."""
    message = {"type": "execute", "id": exec_id, "code": code, "options": options, "providers": manifest}
    return json.dumps(message, separators=(",", ":")).encode()


def tool_result(call: dict[str, Any]) -> bytes:
    """The host's immediate ``ok: true`` answer to a ``tool_call``: result = input."""
    reply: dict[str, Any] = {"type": "tool_result", "callId": call["callId"], "ok": True}
    if "input" in call:
        reply["result"] = call["input"]
    return json.dumps(reply, separators=(",", ":")).encode()


def cancel_message(exec_id: str) -> bytes:
    """The host's ``cancel`` for ``exec_id``."""
    return json.dumps({"type": "cancel", "id": exec_id}, separators=(",", ":")).encode()
