"""A load client process: ``python -m benchkit.load_client MODE URL CONCURRENCY DURATION CODE``.

Its own process, so its CPU is measured apart from the benchmark's and, with
several, spread over cores. It says ``ready``, waits for ``go`` on stdin (so
every client starts together, after the CPU counters are read), runs the
load, and prints the result as one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys

from websockets.uri import parse_uri

from .load_raw import raw_load
from .load_sansio import sansio_load

MODES = ("raw", "sansio")


def ready_for_go() -> bool:
    """Say ``ready`` and wait for the word on stdin: whether it was ``go``."""
    print("ready", flush=True)
    return sys.stdin.readline().strip() == "go"


def main(mode: str, url: str, concurrency: int, duration: float, code: str) -> None:
    """Say ``ready``, wait for ``go`` on stdin, run the load, print the result as JSON."""
    uri = parse_uri(url)
    if not ready_for_go():
        return
    if mode == "raw":
        result = raw_load(uri.host, uri.port, concurrency, duration, code)
    else:
        result = asyncio.run(sansio_load(uri, concurrency, duration, code))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
