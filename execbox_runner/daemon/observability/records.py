"""Session records: each session's full transcript, replayable against any runner.

With ``--record-dir``, every session is written as JSONL in the format of
``transcripts/`` (see ``transcripts/README.md``), so ``execbox-runner replay``
(the conformance harness) can play its host side against a runner and report
any difference. Values that legitimately differ between runs are written as
placeholders: ``durationMs`` as ``<number>``, and each ``callId`` as
``<bind:eKcN>`` (call N of execution K, a fresh name, so it binds whatever
the runner chooses; the host's uses of it refer to the same name). Pauses of the
host longer than ``PAUSE_MS`` become ``sleep_ms`` steps, so a cancel that came
while the guest was busy comes while it is busy again; a runner message that was
long in coming gets a ``timeout_ms`` to match, so the replay waits for it. Beside each transcript,
``.summary.json`` lists the session's executions. The session's correlation id
(as in its log lines) is in the transcript's header line and in the summary;
the harness ignores header fields it does not know, so records still replay.

A transcript streams to disk as the session goes (its steps are appended in
order by a writer task, in a worker thread, as they happen), so recording holds
a few of a session's messages at most, however long it runs and however large
its tool results. It is appended to ``NAME.jsonl.partial`` and renamed
``NAME.jsonl`` when the session ends, so a ``*.jsonl`` is always a whole
session: one still under way, or cut short by a crash, is never replayed as if
it were. A record that cannot be written is logged once and removed; the session
goes on.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import trio

from ...protocol.session import ExecutionEnded

log = logging.getLogger(__name__)
# The transcript format records are written in (the kit's ``FORMAT``): in each header, so that a
# kit reading an older format, or a later one, knows it is not its own.
FORMAT: Final = 1
PAUSE_MS: Final = 10
# A runner message that came SLOW_MS or more after the step before (a long execution, an idle
# timeout's close) is written with a wait of its own for the replay: twice what it took, plus
# HEADROOM_MS, rather than the replay's few seconds per message, which would cut it short.
SLOW_MS: Final = 1000
HEADROOM_MS: Final = 5000
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")


class Recorder:
    """One session's transcript: steps are queued as they happen, ``flush`` has them appended to
    the file, ``close`` has the rest and the summary written when the session ends. The writing is
    a task that ``spawn`` starts (in the daemon's nursery) whenever there is something to write."""

    def __init__(
        self,
        directory: Path,
        peer: str,
        correlation_id: str,
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
        extensions: tuple[str, ...] = (),
    ) -> None:
        self.directory = directory
        self.peer = peer
        self.correlation_id = correlation_id
        self.extensions = extensions  # the protocol extensions the session turned on, for its replay
        self.started = time.time()
        self.path: Path | None = None  # named by the first step (the first execute's id); whole once it ends
        self.executions: list[dict[str, Any]] = []
        self._pending: list[str] = []  # JSON lines not yet on disk, oldest first
        self._steps = 0
        self._failed = False
        self._spawn = spawn
        self._writing = False  # a writer task is under way: one at a time keeps the lines in order
        self._closing = False  # the session ended: the summary follows the last lines
        self._calls: dict[str, str] = {}  # actual callId -> placeholder name, this execution
        self._execution = 0
        self._last = time.monotonic()

    def host_text(self, data: bytes) -> None:
        self._pause()
        try:
            message = json.loads(data)
        except ValueError:
            self._step({"host_raw": data.decode(errors="replace")})
            return
        if isinstance(message, dict) and isinstance(message.get("callId"), str) and message["callId"] in self._calls:
            message["callId"] = f"<bind:{self._calls[message['callId']]}>"
        first = message.get("id") if isinstance(message, dict) and message.get("type") == "execute" else None
        self._step({"host": message}, first if isinstance(first, str) else "session")

    def host_binary(self, data: bytes) -> None:
        self._pause()
        self._step({"host_binary": {"base64": base64.b64encode(data).decode()}})

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
        self._step({"runner": message, **self._wait()})
        self._last = time.monotonic()

    def host_close(self) -> None:
        self._step({"host_close": True})

    def runner_close(self, code: int) -> None:
        self._step({"runner_close": {"code": code}, **self._wait()})

    def _wait(self) -> dict[str, int]:
        """The ``timeout_ms`` of a runner step that was slow to come (see ``SLOW_MS``), else none."""
        waited = round((time.monotonic() - self._last) * 1000)
        return {"timeout_ms": 2 * waited + HEADROOM_MS} if waited >= SLOW_MS else {}

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
        if waited > PAUSE_MS and self._steps:
            self._step({"sleep_ms": waited})
        self._last = now

    def _step(self, step: dict[str, Any], first: str = "session") -> None:
        """Queue one step; the session's first step names the transcript and brings its header."""
        if self._steps == 0:
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(self.started)) + f"{self.started % 1:.6f}"[1:]
            name = _UNSAFE.sub("_", f"{stamp}-{first}")[:120]
            self.path = self.directory / f"{name}.jsonl"
            header = {
                "transcript": name,
                "format": FORMAT,
                "description": f"recorded session from {self.peer} at {stamp}",
                "correlation_id": self.correlation_id,
                **({"extensions": list(self.extensions)} if self.extensions else {}),
            }
            self._pending.append(json.dumps(header))
        self._steps += 1
        self._pending.append(json.dumps(step))

    def flush(self) -> None:
        """Have the queued steps appended to the transcript (in a worker thread: disks may be slow)."""
        if not self._writing and (self._pending or self._closing):
            self._writing = True
            self._spawn(self._write)

    def close(self) -> None:
        """The session ended: have what is left and the summary written (nothing for a session that
        sent nothing)."""
        self._closing = True
        self.flush()

    async def _write(self) -> None:
        try:
            while self._pending:
                lines, self._pending = self._pending, []
                if not self._failed:
                    await trio.to_thread.run_sync(self._append, lines)
            if self._closing and self.path is not None and not self._failed:
                self._closing = False  # written once
                await trio.to_thread.run_sync(self._complete)
                summary = {
                    "transcript": self.path.name,
                    "peer": self.peer,
                    "correlation_id": self.correlation_id,
                    "started": self.started,
                    "executions": self.executions,
                }
                await trio.to_thread.run_sync(
                    self._save, self.path.with_suffix(".summary.json"), json.dumps(summary, indent=2)
                )
        finally:
            self._writing = False

    def _append(self, lines: list[str]) -> None:
        try:
            with _partial(self._named()).open("a") as transcript:
                transcript.writelines(line + "\n" for line in lines)
        except OSError as exc:
            self._fail(exc)

    def _complete(self) -> None:
        """The session ended: its transcript takes its ``.jsonl`` name, whole."""
        try:
            _partial(self._named()).replace(self._named())
        except OSError as exc:
            self._fail(exc)

    def _named(self) -> Path:
        assert self.path is not None  # named by the first step, before anything is written
        return self.path

    def _save(self, path: Path, text: str) -> None:
        """Write ``path`` whole or not at all (written aside, then renamed): a reader that sees the
        summary sees all of it."""
        try:
            _partial(path).write_text(text + "\n")
            _partial(path).replace(path)
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        """Log once and remove what was written: a half record would only mislead (and a full disk
        gets its space back)."""
        self._failed = True
        log.error("could not write the session record %s: %s; the session goes on unrecorded", self.path, exc)
        if self.path is not None:
            for path in (self.path, self.path.with_suffix(".summary.json")):
                with contextlib.suppress(OSError):
                    _partial(path).unlink(missing_ok=True)


def _partial(path: Path) -> Path:
    """Where ``path`` is written until it is whole."""
    return path.with_name(path.name + ".partial")
