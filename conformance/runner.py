"""Playing transcripts against a runner: the host side of each session, over a fresh WebSocket.

It depends only on ``websockets`` and the standard library, never on
``execbox_runner``: it judges a runner from the outside, exactly as a host sees
it, so it can be pointed at any implementation of the protocol.

Two kinds of failure are kept apart. A ``Mismatch`` is a verdict on one
transcript (the runner answered wrongly). A ``TargetError`` means no verdict was
possible: the runner could not be reached or refused the handshake, which is a
configuration problem (URL, token, certificate) the user must see at once.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from .connection import Connection, connect
from .matcher import Bindings, Mismatch, match, show, substitute, substitute_raw
from .transcript import JSON, Step, Transcript, load_transcript, loads_strict

__all__ = [
    "CONNECT_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "Result",
    "Target",
    "TargetError",
    "run_all",
    "run_transcript",
]

#: Seconds the runner gets for each expected frame or close.
DEFAULT_TIMEOUT: Final = 5.0
#: Seconds for the TCP connection, TLS and the WebSocket handshake together.
CONNECT_TIMEOUT: Final = 5.0
_CLOSE_TIMEOUT: Final = 2.0
#: A tool call's placeholder ``callId`` in a transcript, which host steps answer as ``<bind:NAME>``.
_CALL_ID: Final = re.compile(r"<(?:bind|unique):([A-Za-z0-9_.-]+)>")


#: The handshake header in which a host asks for protocol extensions and the runner answers those it
#: turned on (a runner offering none sends none).
EXTENSIONS_HEADER: Final = "Execbox-Extensions"


class TargetError(Exception):
    """The runner could not be reached, or refused the WebSocket handshake: no transcript could be judged."""


class _Unsupported(Exception):
    """The runner did not turn on an extension the transcript needs."""


@dataclass(frozen=True)
class Target:
    """Where the runner listens and how to reach it: URL, extra handshake headers, TLS context.

    ``ssl_context`` is only for ``wss://`` URLs; ``None`` there means the
    system's trusted certificates, with the host name checked.
    """

    url: str
    headers: tuple[tuple[str, str], ...] = ()
    ssl_context: ssl.SSLContext | None = None
    connect_timeout: float = CONNECT_TIMEOUT


@dataclass(frozen=True)
class Result:
    """The verdict on one transcript: ``difference`` is the first thing the runner got wrong, on one line;
    ``skipped`` says why a transcript needing a protocol extension the runner does not offer was not run."""

    transcript: Transcript
    passed: bool
    difference: str = ""
    detail: str = ""  # the whole expected and actual messages, when a message differed
    seconds: float = 0.0
    skipped: str = ""

    @property
    def failed(self) -> bool:
        return not self.passed and not self.skipped

    @property
    def name(self) -> str:
        return self.transcript.name

    @property
    def path(self) -> Path:
        return self.transcript.path

    @property
    def reason(self) -> str:
        """Everything known about the failure: the difference, then the detail."""
        return f"{self.difference}; {self.detail}" if self.detail else self.difference

    def line(self) -> str:
        """The one line a person reads for this transcript."""
        if self.skipped:
            return f"SKIP {self.name}: {self.skipped}"
        text = f"{'PASS' if self.passed else 'FAIL'} {self.name} ({self.seconds * 1000:.0f} ms)"
        return text if self.passed else f"{text}: {self.reason}"


def run_transcript(
    target: Target | str, transcript: Transcript | Path | str, *, timeout: float = DEFAULT_TIMEOUT
) -> Result:
    """Play one transcript's host side against the runner on a fresh connection.

    Raises ``TargetError`` if the connection cannot be opened, and
    ``TranscriptError`` if ``transcript`` is a path to a malformed file.
    """
    target = Target(target) if isinstance(target, str) else target
    transcript = transcript if isinstance(transcript, Transcript) else load_transcript(transcript)
    began = time.monotonic()
    try:
        _play(target, transcript, timeout)
    except Mismatch as exc:
        return Result(transcript, False, exc.difference, exc.detail, time.monotonic() - began)
    except _Unsupported as exc:
        return Result(transcript, False, seconds=time.monotonic() - began, skipped=str(exc))
    return Result(transcript, True, seconds=time.monotonic() - began)


def run_all(
    target: Target | str,
    transcripts: Iterable[Transcript],
    *,
    timeout: float = DEFAULT_TIMEOUT,
    progress: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run transcripts in order, calling ``progress`` with each result as it comes.

    A ``TargetError`` before the runner was ever reached is raised (the run
    cannot say anything). Once the runner has answered, a later connection
    failure is that transcript's failure: the runner went away mid-run.
    """
    target = Target(target) if isinstance(target, str) else target
    results: list[Result] = []
    for transcript in transcripts:
        try:
            result = run_transcript(target, transcript, timeout=timeout)
        except TargetError as exc:
            if not results:
                raise
            result = Result(transcript, False, str(exc))
        if progress is not None:
            progress(result)
        results.append(result)
    return results


# ---------------------------------------------------------------------- the connection


def _connect(target: Target, extensions: tuple[str, ...] = ()) -> Connection:
    """Open the WebSocket, turning each way this can fail into one clear ``TargetError`` sentence.
    No WebSocket extension is offered (plain frames: nothing a minimal runner must negotiate), no
    ping sent (noise in a scripted session), no proxy used; the protocol ``extensions`` asked for."""
    url = target.url
    asked = ((EXTENSIONS_HEADER, ", ".join(extensions)),) if extensions else ()
    try:
        return connect(
            url,
            additional_headers=(*target.headers, *asked),
            ssl_context=target.ssl_context,
            open_timeout=target.connect_timeout,
            close_timeout=_CLOSE_TIMEOUT,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        hint = {401: " (a token is needed: --token)", 403: " (check --token and --header)"}.get(status, "")
        raise TargetError(
            f"the runner at {url} refused the WebSocket handshake: HTTP {status} {exc.response.reason_phrase}{hint}"
        ) from None
    except InvalidURI as exc:
        raise TargetError(f"invalid URL {url!r}: {exc.msg}") from None
    except InvalidHandshake as exc:
        raise TargetError(f"{url} did not complete a WebSocket handshake: {exc}") from None
    except ssl.SSLCertVerificationError as exc:
        raise TargetError(
            f"cannot verify the TLS certificate of {url}: {exc.verify_message} (trust its CA with --cafile, or --insecure)"
        ) from None
    except ssl.SSLError as exc:
        raise TargetError(f"TLS with {url} failed: {exc.reason or exc}") from None
    except ValueError as exc:  # after ssl's errors (ValueErrors too): a header websockets cannot send, ...
        raise TargetError(f"cannot connect to {url}: {exc}") from None
    except TimeoutError:
        raise TargetError(
            f"cannot connect to {url}: no WebSocket handshake within {target.connect_timeout:g} s"
        ) from None
    except socket.gaierror as exc:
        raise TargetError(f"cannot resolve the host of {url}: {exc.strerror}") from None
    except OSError as exc:
        raise TargetError(f"cannot connect to {url}: {exc.strerror or exc}") from None


def _play(target: Target, transcript: Transcript, timeout: float) -> None:
    ws = _connect(target, transcript.extensions)
    with ws:  # leaving it closes the connection (a no-op if it is already closed)
        if missing := _not_turned_on(ws, transcript.extensions):
            raise _Unsupported(f"the runner does not offer the {', '.join(missing)} extension")
        bindings: Bindings = {}
        lines: list[JSON] = []  # log lines received beyond what the log steps so far expected
        for index, step in enumerate(transcript.steps, start=1):
            where = f"step {index} (line {step.line}, {step.kind})"
            try:
                _perform(ws, step, bindings, timeout, lines)
            except Mismatch as exc:
                raise _hinted(exc.at(where), transcript) from None
            except OSError as exc:
                raise Mismatch(f"{where}: transport error: {exc!r}") from None
        last = transcript.steps[-1]
        if last.kind == "runner" and last.value.get("type") == "done":
            _nothing_after_done(ws, f"after step {len(transcript.steps)} (line {last.line}, the done)")


def _nothing_after_done(ws: Connection, where: str) -> None:
    """Spec, State Machine: after ``done`` no further protocol messages are valid. The host closes the
    connection; a message the runner sent after its last ``done``, before it closed, is a difference
    (a second ``done``, a late ``tool_call`` or ``log``)."""
    if late := ws.close():
        raise Mismatch(f"{where}: the runner sent {_shown(late[0])} after the done; nothing may follow a done")


def _shown(frame: str | bytes) -> str:
    """A runner frame for a message: its JSON compacted, else its text or bytes as they came."""
    if isinstance(frame, bytes):
        return repr(frame[:60])
    try:
        return show(loads_strict(frame))
    except ValueError:
        return show(frame)


def _hinted(mismatch: Mismatch, transcript: Transcript) -> Mismatch:
    """``mismatch``, naming the runner's tool calls that no host step of the transcript refers to: a
    record missing its tool results (edited, or cut short) differs for that reason, not the runner's."""
    calls = [
        found.group(1)
        for step in transcript.steps
        if step.kind == "runner" and step.value.get("type") == "tool_call"
        if (found := _CALL_ID.fullmatch(str(step.value.get("callId"))))
    ]
    host = "".join(json.dumps(step.value) for step in transcript.steps if step.kind in ("host", "host_raw"))
    if unanswered := [name for name in calls if f"<bind:{name}>" not in host]:
        hint = f" (the transcript never answers the tool call {', '.join(unanswered)}: are its tool results missing?)"
        return Mismatch(mismatch.difference + hint, mismatch.detail)
    return mismatch


def _not_turned_on(ws: Connection, extensions: tuple[str, ...]) -> list[str]:
    """Those of ``extensions`` the runner's handshake answer does not name."""
    answered = ws.response.headers.get_all(EXTENSIONS_HEADER) if ws.response is not None else []
    turned_on = {token.strip().lower() for value in answered for token in value.split(",")}
    return [name for name in extensions if name.lower() not in turned_on]


def _perform(ws: Connection, step: Step, bindings: Bindings, timeout: float, lines: list[JSON]) -> None:
    """Perform one step, raising ``Mismatch`` if the runner does not do what it expects; ``lines``
    holds the log lines received ahead of the log steps that expect them."""
    kind, value = step.kind, step.value
    wait = step.timeout if step.timeout is not None else timeout
    if lines and kind in ("runner", "runner_close", "runner_silent_ms") and not _is_log(value):
        raise Mismatch(f"the runner sent log lines the transcript does not expect: {show(lines)}")
    if kind == "runner" and _is_log(value):
        _expect_log_lines(ws, value, bindings, wait, lines)
    elif kind == "host":
        _send(ws, json.dumps(substitute(value, bindings), ensure_ascii=False, allow_nan=False))
    elif kind == "host_raw":
        _send(ws, substitute_raw(value, bindings))
    elif kind == "host_binary":
        _send(ws, value.encode() if isinstance(value, str) else base64.b64decode(value["base64"]))
    elif kind == "sleep_ms":
        time.sleep(value / 1000)
    elif kind == "runner":
        actual = _receive(ws, wait, f"waiting for {show(value)}")
        if actual is None:
            raise Mismatch(f"timed out after {wait:g} s waiting for {show(value)}")
        try:
            match(value, actual, bindings)
        except Mismatch as exc:
            raise Mismatch(exc.difference, f"expected {show(value)}; actual {show(actual)}") from None
    elif kind == "runner_silent_ms":
        actual = _receive(ws, value / 1000, "during a silent period")
        if actual is not None:
            raise Mismatch(f"expected no message for {value} ms, got {show(actual)}")
    elif kind == "runner_close":
        _expect_close(ws, value, wait)
    elif kind == "host_close":
        options = value if isinstance(value, dict) else {}
        ws.close(options.get("code", 1000), options.get("reason", ""))
        if ws.protocol.close_rcvd is None:
            # The runner must answer the host's close frame (RFC 6455 closing handshake).
            raise Mismatch(f"the runner did not answer the host's close frame within {_CLOSE_TIMEOUT:g} s")


def _is_log(value: JSON) -> bool:
    return isinstance(value, dict) and value.get("type") == "log" and isinstance(value.get("lines"), list)


def _expect_log_lines(
    ws: Connection, expected: dict[str, JSON], bindings: Bindings, wait: float, lines: list[JSON]
) -> None:
    """A ``log`` step: its lines, however the runner grouped them into ``log`` messages. The grouping
    is timing (each message has "one or more lines"), so a recorded session replays whether the
    runner now sends them together or apart; the lines themselves and their order must match."""
    want = expected["lines"]
    while len(lines) < len(want):
        actual = _receive(ws, wait, f"waiting for {show(expected)}")
        if actual is None:
            raise Mismatch(f"timed out after {wait:g} s waiting for {show(expected)}")
        if not _is_log(actual):
            raise Mismatch(f"expected the log lines {show(want[len(lines) :])}", f"actual {show(actual)}")
        try:
            match({**expected, "lines": []}, {**actual, "lines": []}, bindings)
        except Mismatch as exc:
            raise Mismatch(exc.difference, f"expected {show(expected)}; actual {show(actual)}") from None
        lines.extend(actual["lines"])
    got, lines[:] = lines[: len(want)], lines[len(want) :]
    try:
        match(want, got, bindings, "$.lines")
    except Mismatch as exc:
        raise Mismatch(exc.difference, f"expected the lines {show(want)}; actual {show(got)}") from None


def _send(ws: Connection, data: str | bytes) -> None:
    try:
        ws.send(data)
    except ConnectionClosed as exc:
        raise Mismatch(
            f"the runner closed the connection ({_describe_close(exc)}) before the host could send"
        ) from None


def _receive(ws: Connection, wait: float, doing: str) -> JSON | None:
    """The next runner message as JSON, or ``None`` if none came within ``wait`` seconds."""
    try:
        frame = ws.recv(timeout=wait)
    except TimeoutError:
        return None
    except ConnectionClosed as exc:
        raise Mismatch(f"the runner closed the connection ({_describe_close(exc)}) {doing}") from None
    except UnicodeDecodeError as exc:
        raise Mismatch(f"the runner sent a text frame that is not UTF-8 ({exc.reason}) {doing}") from None
    if isinstance(frame, bytes):
        raise Mismatch(f"the runner sent a binary frame {frame[:60]!r}; runner messages are JSON text frames")
    try:
        return loads_strict(frame)
    except ValueError as exc:
        raise Mismatch(f"the runner sent a frame that is not JSON ({exc}): {frame[:200]!r}") from None


def _expect_close(ws: Connection, expected: dict[str, JSON], wait: float) -> None:
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Mismatch(f"timed out after {wait:g} s waiting for the runner to close with {expected['code']}")
        try:
            frame = ws.recv(timeout=left)
        except TimeoutError:
            continue
        except UnicodeDecodeError:
            raise Mismatch(
                f"expected the runner to close with {expected['code']}, got a text frame that is not UTF-8"
            ) from None
        except ConnectionClosed as exc:
            received = exc.rcvd
            if received is None:
                raise Mismatch(
                    f"expected close code {expected['code']}, but the connection dropped without a close frame"
                ) from None
            if received.code != expected["code"]:
                raise Mismatch(
                    f"expected close code {expected['code']}, got {received.code} ({received.reason!r})"
                ) from None
            if "reason" in expected and received.reason != expected["reason"]:
                raise Mismatch(f"expected close reason {expected['reason']!r}, got {received.reason!r}") from None
            return
        raise Mismatch(f"expected the runner to close with {expected['code']}, got message {_shown(frame)}")


def _describe_close(exc: ConnectionClosed) -> str:
    if exc.rcvd is not None:
        return f"code {exc.rcvd.code}" + (f", reason {exc.rcvd.reason!r}" if exc.rcvd.reason else "")
    return "no close frame"
