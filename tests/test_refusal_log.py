"""Refused handshakes are logged with their peer, and a flood of them costs a bounded log:
a token bucket per reason (unit-tested on an injected clock), then one summary line."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Request

from execbox_runner.daemon.observability import endpoints
from execbox_runner.daemon.observability.endpoints import (
    REFUSAL_LINES_BURST,
    REFUSAL_LINES_PER_S,
    DaemonState,
    Refusals,
    TokenBucket,
)

from .daemonkit import running_daemon
from .test_dashboards import scrape
from .test_http_edge import UPGRADE, exchange
from .test_operations import metric

LOG_WAIT_S = 10.0
BATCH = 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_token_bucket_allows_its_burst_then_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(rate=2, burst=3, clock=clock)
    assert [bucket.take() for _ in range(5)] == [True, True, True, False, False]
    clock.now += 0.5  # one token back
    assert [bucket.take(), bucket.take()] == [True, False]
    clock.now += 60  # refilled to the burst, not beyond
    assert sum(bucket.take() for _ in range(10)) == 3


def lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == endpoints.__name__]


def test_a_flood_of_refusals_is_a_few_lines_and_one_summary_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=endpoints.__name__)
    clock = Clock()
    refusals = Refusals(clock)
    for index in range(100):
        refusals.refuse("busy", f"10.0.0.{index}:4000")
    refusals.refuse("unauthorized", "10.0.0.1:5000")  # another reason has its own bucket
    assert refusals.counts["busy"] == 100 and refusals.counts["unauthorized"] == 1  # every one counted
    logged = lines(caplog)
    assert len(logged) == REFUSAL_LINES_BURST + 1
    first = logged[0]
    assert first.getMessage() == "refused a handshake from 10.0.0.0:4000: busy (at the maximum of concurrent sessions)"
    assert (first.refusal, first.peer) == ("busy", "10.0.0.0:4000")  # type: ignore[attr-defined]
    caplog.clear()
    refusals.summarize()
    (summary,) = lines(caplog)
    assert summary.levelno == logging.WARNING
    assert summary.getMessage().startswith(f"suppressed {100 - REFUSAL_LINES_BURST} refusals (busy)")
    assert (summary.refusal, summary.suppressed) == ("busy", 100 - REFUSAL_LINES_BURST)  # type: ignore[attr-defined]
    caplog.clear()
    refusals.summarize()  # nothing suppressed since: no line
    assert lines(caplog) == []
    clock.now += 1  # a second later the bucket has refilled at its rate
    for _ in range(100):
        refusals.refuse("busy", "10.0.0.9:4000")
    assert len(lines(caplog)) == REFUSAL_LINES_PER_S


def test_route_logs_a_refusal_with_its_peer(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=endpoints.__name__)
    state = DaemonState(max_sessions=1, report={}, tokens=(b"secret",))
    request = Request("/", Headers([("Authorization", "Bearer wrong")]))
    answer = endpoints.route(request, state, peer="192.0.2.7:51000")
    assert answer is not None and answer.status_code == 401
    (line,) = lines(caplog)
    assert (line.refusal, line.peer) == ("unauthorized", "192.0.2.7:51000")  # type: ignore[attr-defined]
    assert "192.0.2.7:51000" in line.getMessage()


def test_a_daemon_logs_a_flood_of_refusals_within_its_bound() -> None:
    refused, request = 0, (UPGRADE + "Authorization: Bearer wrong\r\n\r\n").encode()
    with running_daemon("--tokens", "right") as d, ThreadPoolExecutor(BATCH) as pool:
        started = time.monotonic()
        # More refusals than the bucket lets through in the time they take, however long that is.
        for _ in range(30):
            if refused > REFUSAL_LINES_BURST + REFUSAL_LINES_PER_S * (time.monotonic() - started + 1):
                break
            answers = list(pool.map(lambda _: exchange(d, request), range(BATCH)))  # at once
            assert all(answer.startswith(b"HTTP/1.1 401") for answer in answers)
            refused += BATCH
        elapsed = time.monotonic() - started
        assert metric(scrape(d.url), "execbox_rejected_handshakes_total", reason="unauthorized") == refused
        deadline = time.monotonic() + LOG_WAIT_S
        while True:  # every refusal is a line or part of a summary, within a second or so
            records = [json.loads(line) for line in d.log_lines() if line.startswith("{")]
            logged = [r for r in records if r.get("refusal") == "unauthorized" and "suppressed" not in r]
            suppressed = sum(
                r["suppressed"] for r in records if r.get("refusal") == "unauthorized" and "suppressed" in r
            )
            if len(logged) + suppressed == refused or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert len(logged) + suppressed == refused
    assert suppressed > 0
    assert len(logged) <= REFUSAL_LINES_BURST + REFUSAL_LINES_PER_S * (elapsed + 1)
    assert {r["level"] for r in logged} == {"info"}
