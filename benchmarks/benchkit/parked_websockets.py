"""The ``websockets`` parked client: websockets' asyncio client, one task per execution.

What hosts written in Python would use; kept as a cross-check of the raw
client, at about four times its CPU per session.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from .parking import RUN_S, WAIT_S, ParkedTally, answer, execute


async def _one(url: str, index: int, delay: float, tally: ParkedTally, opening: asyncio.Semaphore) -> None:
    """Execution ``index`` on its own connection; its outcome into ``tally``."""
    outcome, status = "connection ended without done", 0
    try:
        # At most --opening handshakes at a time: see RawParked.launch.
        async with opening:
            ws = await connect(url, open_timeout=WAIT_S, close_timeout=WAIT_S, max_queue=4)
        status = 101
        async with ws:
            await ws.send(execute(index, delay).decode())
            while True:
                message = json.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
                if message["type"] == "tool_call":
                    tally.parked()
                    await asyncio.sleep(delay)
                    await ws.send(answer(message, index).decode())
                elif message["type"] == "done":
                    outcome = tally.done(message, index)
                    break
    except InvalidStatus as exc:
        outcome, status = f"HTTP {exc.response.status_code}", exc.response.status_code
    except Exception as exc:  # a benchmark counts failures, it does not stop at the first
        outcome = f"{type(exc).__name__}: {str(exc)[:80]}"
    tally.end(outcome, status)


async def websockets_parked(url: str, n: int, delay: float, opening: int) -> dict[str, Any]:
    """``n`` executions at once, at most ``opening`` handshakes at a time; the tally as a JSON-ready result."""
    tally = ParkedTally(n)
    handshakes = asyncio.Semaphore(max(1, opening))
    tasks = [asyncio.create_task(_one(url, index, delay, tally, handshakes)) for index in range(n)]
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=delay + RUN_S)
    except TimeoutError:
        pass  # the sessions still open count as unended
    return tally.result()
