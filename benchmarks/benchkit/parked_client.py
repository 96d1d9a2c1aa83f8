"""A parked client process: ``python -m benchkit.parked_client MODE URL N DELAY OPENING``.

Its own process, so that its CPU is measured apart from the benchmark's
(which samples the daemon tree's RSS meanwhile). It says ``ready``, waits for
``go`` on stdin (sent after the daemon's CPU counters are read), runs the
executions, and prints the result as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from websockets.uri import parse_uri

from .load_client import ready_for_go
from .parked_raw import raw_parked
from .parked_websockets import websockets_parked
from .parking import raise_nofile_limit

MODES = ("raw", "websockets")


def main(mode: str, url: str, n: int, delay: float, opening: int) -> None:
    """Say ``ready``, wait for ``go`` on stdin, run the executions, print the result as JSON."""
    raise_nofile_limit()
    uri = parse_uri(url)
    if uri.host != "127.0.0.1":  # thousands of connections: never to another machine
        raise SystemExit(f"parked_client: 127.0.0.1 only, not {uri.host}")
    if not ready_for_go():
        return
    result: dict[str, Any]
    if mode == "raw":
        result = raw_parked(uri.host, uri.port, n, delay, opening)
    else:
        result = asyncio.run(websockets_parked(url, n, delay, opening))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
