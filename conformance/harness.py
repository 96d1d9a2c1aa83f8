"""``execbox-conformance``: replay golden transcripts against any execbox runner.

A transcript (see ``transcripts/README.md``) is a JSONL script of one host
session: what the host sends, and what the runner must answer. The harness
plays the host over a fresh WebSocket connection per transcript and checks
every runner frame, the runner's close code, and (where a transcript asks)
the runner's silence.

It deliberately depends only on ``websockets`` and the standard library, never
on ``execbox_runner``: it judges a runner from the outside, exactly as a host
sees it, so it can be pointed at any implementation of the protocol.

Usage::

    execbox-conformance ws://HOST:PORT/ [--transcripts DIR] [-k SUBSTRING] [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final, TypeAlias

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.sync.client import ClientConnection, connect

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_TRANSCRIPTS",
    "Mismatch",
    "Result",
    "Transcript",
    "TranscriptError",
    "load_transcript",
    "main",
    "match",
    "run_all",
    "run_transcript",
    "substitute",
    "substitute_raw",
    "summary",
    "transcript_paths",
]

#: The golden transcripts, shipped inside this package as data.
DEFAULT_TRANSCRIPTS: Final = Path(str(resources.files(__package__ or __name__.rpartition(".")[0]) / "transcripts"))
#: Seconds the runner gets for each expected frame or close.
DEFAULT_TIMEOUT: Final = 5.0
# Bounds for the parts of a transcript that are not an expected message.
_CONNECT_TIMEOUT: Final = 5.0
_CLOSE_TIMEOUT: Final = 2.0

JSON: TypeAlias = Any
Bindings: TypeAlias = dict[str, str]

_BIND = re.compile(r"<bind:([A-Za-z0-9_.-]+)>")
_UNIQUE = re.compile(r"<unique:([A-Za-z0-9_.-]+)>")
_RANGE = re.compile(r"<number:(-?[0-9]+(?:\.[0-9]+)?)?\.\.(-?[0-9]+(?:\.[0-9]+)?)?>")
_STEP_KINDS: Final = frozenset(
    {"host", "host_raw", "host_binary", "runner", "runner_close", "runner_silent_ms", "sleep_ms", "host_close"}
)


class TranscriptError(Exception):
    """The transcript file itself is malformed (not a runner failure)."""


class Mismatch(Exception):
    """The runner did something other than what the transcript expects."""


@dataclass(frozen=True)
class Result:
    """The verdict on one transcript: ``reason`` says what went wrong when not ``passed``."""

    name: str
    path: Path
    passed: bool
    reason: str = ""
    seconds: float = 0.0

    def line(self) -> str:
        """The one line the CLI prints for this transcript."""
        status = "PASS" if self.passed else "FAIL"
        text = f"{status} {self.name} ({self.seconds * 1000:.0f} ms)"
        return text if self.passed else f"{text}: {self.reason}"


@dataclass(frozen=True)
class Step:
    kind: str
    value: JSON
    line: int
    timeout: float | None = None  # an optional per-step override, in seconds


@dataclass(frozen=True)
class Transcript:
    name: str
    description: str
    steps: list[Step] = field(default_factory=list)


# ---------------------------------------------------------------------- loading


def load_transcript(path: Path) -> Transcript:
    """Parse and validate a transcript file, so that typos fail loudly instead of passing."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TranscriptError(f"cannot read {path}: {exc}") from None
    objects: list[tuple[int, dict[str, JSON]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw, parse_constant=_reject_constant)
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            raise TranscriptError(f"line {number}: invalid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise TranscriptError(f"line {number}: each line must be a JSON object")
        objects.append((number, value))
    if not objects or "transcript" not in objects[0][1]:
        raise TranscriptError('the first line must be a header {"transcript": NAME, "description": ...}')
    header = objects[0][1]
    name = header["transcript"]
    if not isinstance(name, str) or not name:
        raise TranscriptError("the header's transcript name must be a non-empty string")
    description = header.get("description", "")
    if not isinstance(description, str):
        raise TranscriptError("the header's description must be a string")
    steps = [_parse_step(number, value) for number, value in objects[1:]]
    if not steps:
        raise TranscriptError("a transcript needs at least one step")
    return Transcript(name=name, description=description, steps=steps)


def _parse_step(number: int, value: dict[str, JSON]) -> Step:
    timeout_ms = value.get("timeout_ms")
    kinds = [key for key in value if key != "timeout_ms"]
    if len(kinds) != 1 or kinds[0] not in _STEP_KINDS:
        raise TranscriptError(
            f"line {number}: a step has exactly one of {sorted(_STEP_KINDS)} (plus optional timeout_ms), got {sorted(value)}"
        )
    kind = kinds[0]
    body = value[kind]
    if timeout_ms is not None and (
        not _is_number(timeout_ms) or timeout_ms <= 0 or kind not in ("runner", "runner_close")
    ):
        raise TranscriptError(f"line {number}: timeout_ms must be a positive number on a runner or runner_close step")
    ok = {
        "host": isinstance(body, dict),
        "runner": isinstance(body, dict),
        "host_raw": isinstance(body, str),
        "host_binary": isinstance(body, str)
        or (isinstance(body, dict) and set(body) == {"base64"} and isinstance(body["base64"], str)),
        "runner_close": isinstance(body, dict)
        and set(body) <= {"code", "reason"}
        and "code" in body
        and isinstance(body["code"], int),
        "runner_silent_ms": _is_number(body) and body >= 0,
        "sleep_ms": _is_number(body) and body >= 0,
        "host_close": body is True or (isinstance(body, dict) and set(body) <= {"code", "reason"}),
    }[kind]
    if not ok:
        raise TranscriptError(f"line {number}: malformed {kind} step: {json.dumps(body)}")
    if kind == "host_binary" and isinstance(body, dict):
        try:
            base64.b64decode(body["base64"], validate=True)
        except ValueError:
            raise TranscriptError(f"line {number}: host_binary base64 is not valid base64") from None
    return Step(kind=kind, value=body, line=number, timeout=None if timeout_ms is None else timeout_ms / 1000)


def _is_number(value: JSON) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# ---------------------------------------------------------------------- matching


def match(expected: JSON, actual: JSON, bindings: Bindings, path: str = "$") -> None:
    """Check ``actual`` against ``expected`` with placeholders; raise ``Mismatch`` at the first difference.

    Objects must have exactly the same keys (so an omitted ``result`` or
    ``input`` is checked too), arrays the same length, scalars equal with JSON
    types kept apart (``true`` is not ``1``). ``bindings`` grows as
    ``<bind:NAME>`` placeholders meet their first value.
    """
    if (
        isinstance(expected, str)
        and expected.startswith("<")
        and expected.endswith(">")
        and _placeholder(expected, actual, bindings, path)
    ):
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"at {path}: expected an object, got {_show(actual)}")
        if "type" in expected and "type" in actual:
            # A different message altogether is best reported as such, not as a key difference.
            match(expected["type"], actual["type"], bindings, f"{path}.type")
        missing = [key for key in expected if key not in actual]
        extra = [key for key in actual if key not in expected]
        if missing:
            raise Mismatch(f"at {path}: missing key(s) {', '.join(map(repr, missing))}")
        if extra:
            raise Mismatch(f"at {path}: unexpected key(s) {', '.join(map(repr, extra))}")
        for key, value in expected.items():
            match(value, actual[key], bindings, f"{path}.{key}")
        return
    if isinstance(expected, list):
        if not isinstance(actual, list):
            raise Mismatch(f"at {path}: expected an array, got {_show(actual)}")
        if len(expected) != len(actual):
            raise Mismatch(f"at {path}: expected {len(expected)} item(s), got {len(actual)}")
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            match(want, got, bindings, f"{path}[{index}]")
        return
    if _json_kind(expected) != _json_kind(actual) or expected != actual:
        raise Mismatch(f"at {path}: expected {_show(expected)}, got {_show(actual)}")


def _placeholder(expected: str, actual: JSON, bindings: Bindings, path: str) -> bool:
    """Apply a placeholder; ``False`` if ``expected`` is an ordinary string after all."""
    if expected == "<any>":
        return True
    if expected == "<string>":
        if not isinstance(actual, str):
            raise Mismatch(f"at {path}: expected any string, got {_show(actual)}")
        return True
    if expected == "<number>":
        if not _is_number(actual):
            raise Mismatch(f"at {path}: expected any number, got {_show(actual)}")
        return True
    if found := _RANGE.fullmatch(expected):
        if not _is_number(actual):
            raise Mismatch(f"at {path}: expected a number, got {_show(actual)}")
        low, high = (None if bound is None else float(bound) for bound in found.groups())
        if (low is not None and actual < low) or (high is not None and actual > high):
            raise Mismatch(f"at {path}: expected a number in {expected[8:-1]}, got {_show(actual)}")
        return True
    if found := _BIND.fullmatch(expected) or _UNIQUE.fullmatch(expected):
        name = found.group(1)
        if not isinstance(actual, str):
            raise Mismatch(f"at {path}: expected a string for {name}, got {_show(actual)}")
        if name in bindings:
            if bindings[name] != actual:
                raise Mismatch(f"at {path}: expected {name} = {_show(bindings[name])}, got {_show(actual)}")
            return True
        if expected.startswith("<unique:"):
            # A fresh identifier, e.g. a callId that must differ from every earlier one.
            for other, value in bindings.items():
                if value == actual:
                    raise Mismatch(
                        f"at {path}: expected a new value for {name}, got {_show(actual)}, already bound to {other}"
                    )
        bindings[name] = actual
        return True
    return False


def _json_kind(value: JSON) -> str:
    if isinstance(value, bool):
        return "boolean"
    if _is_number(value):
        return "number"
    return type(value).__name__


def substitute(value: JSON, bindings: Bindings) -> JSON:
    """Replace ``<bind:NAME>`` strings in a host message with their bound values."""
    if isinstance(value, str) and (found := _BIND.fullmatch(value)):
        name = found.group(1)
        if name not in bindings:
            raise Mismatch(f"host message uses {name}, which no runner message has bound yet")
        return bindings[name]
    if isinstance(value, dict):
        return {key: substitute(item, bindings) for key, item in value.items()}
    if isinstance(value, list):
        return [substitute(item, bindings) for item in value]
    return value


def substitute_raw(text: str, bindings: Bindings) -> str:
    """Replace ``<bind:NAME>`` inside a raw frame with the bound string, JSON-escaped (no quotes added)."""

    def replace(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in bindings:
            raise Mismatch(f"host_raw uses {name}, which no runner message has bound yet")
        return json.dumps(bindings[name], ensure_ascii=False)[1:-1]

    return _BIND.sub(replace, text)


def _show(value: JSON, limit: int = 400) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------- running


def run_transcript(url: str, path: Path | str, *, timeout: float = DEFAULT_TIMEOUT) -> Result:
    """Play one transcript's host side against the runner at ``url`` on a fresh connection."""
    path = Path(path)
    began = time.monotonic()
    try:
        transcript = load_transcript(path)
    except TranscriptError as exc:
        return Result(path.stem, path, False, f"invalid transcript: {exc}", time.monotonic() - began)
    try:
        _play(url, transcript, timeout)
    except Mismatch as exc:
        return Result(transcript.name, path, False, str(exc), time.monotonic() - began)
    return Result(transcript.name, path, True, "", time.monotonic() - began)


def run_all(
    url: str,
    directory: Path | str = DEFAULT_TRANSCRIPTS,
    *,
    select: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Result]:
    """Run every ``*.jsonl`` transcript in ``directory`` (name order), optionally only those whose file name contains ``select``."""
    return [run_transcript(url, path, timeout=timeout) for path in transcript_paths(directory, select)]


def transcript_paths(directory: Path | str, select: str | None = None) -> list[Path]:
    paths = sorted(Path(directory).glob("*.jsonl"))
    return [path for path in paths if select is None or select in path.name]


def _play(url: str, transcript: Transcript, timeout: float) -> None:
    connected = False
    try:
        with connect(
            url,
            open_timeout=_CONNECT_TIMEOUT,
            close_timeout=_CLOSE_TIMEOUT,
            compression=None,  # plain frames: nothing a minimal runner must negotiate
            max_size=None,
            ping_interval=None,  # pings would be noise in a scripted session
            proxy=None,
        ) as ws:
            connected = True
            bindings: Bindings = {}
            for index, step in enumerate(transcript.steps, start=1):
                try:
                    _perform(ws, step, bindings, timeout)
                except Mismatch as exc:
                    raise Mismatch(f"step {index} (line {step.line}, {step.kind}): {exc}") from None
            # Leaving the block closes the connection (a no-op if it is already closed).
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
        if connected:
            raise Mismatch(f"transport error: {exc!r}") from None
        raise Mismatch(f"cannot connect to {url}: {exc!r}") from None


def _perform(ws: ClientConnection, step: Step, bindings: Bindings, timeout: float) -> None:
    """Perform one step, raising ``Mismatch`` if the runner does not do what it expects."""
    kind, value = step.kind, step.value
    wait = step.timeout if step.timeout is not None else timeout
    if kind == "host":
        _send(ws, json.dumps(substitute(value, bindings), ensure_ascii=False, allow_nan=False))
    elif kind == "host_raw":
        _send(ws, substitute_raw(value, bindings))
    elif kind == "host_binary":
        _send(ws, value.encode() if isinstance(value, str) else base64.b64decode(value["base64"]))
    elif kind == "sleep_ms":
        time.sleep(value / 1000)
    elif kind == "runner":
        actual = _receive(ws, wait, f"waiting for {_show(value)}")
        if actual is None:
            raise Mismatch(f"timed out after {wait:g} s waiting for {_show(value)}")
        try:
            match(value, actual, bindings)
        except Mismatch as exc:
            raise Mismatch(f"{exc}; expected {_show(value)}; actual {_show(actual)}") from None
    elif kind == "runner_silent_ms":
        actual = _receive(ws, value / 1000, "during a silent period")
        if actual is not None:
            raise Mismatch(f"expected no message for {value} ms, got {_show(actual)}")
    elif kind == "runner_close":
        _expect_close(ws, value, wait)
    elif kind == "host_close":
        options = value if isinstance(value, dict) else {}
        ws.close(options.get("code", 1000), options.get("reason", ""))
        if ws.protocol.close_rcvd is None:
            # The runner must answer the host's close frame (RFC 6455 closing handshake).
            raise Mismatch(f"the runner did not answer the host's close frame within {_CLOSE_TIMEOUT:g} s")


def _send(ws: ClientConnection, data: str | bytes) -> None:
    try:
        ws.send(data)
    except ConnectionClosed as exc:
        raise Mismatch(
            f"the runner closed the connection ({_describe_close(exc)}) before the host could send"
        ) from None


def _receive(ws: ClientConnection, wait: float, doing: str) -> JSON | None:
    """The next runner message as JSON, or ``None`` if none came within ``wait`` seconds."""
    try:
        frame = ws.recv(timeout=wait)
    except TimeoutError:
        return None
    except ConnectionClosed as exc:
        raise Mismatch(f"the runner closed the connection ({_describe_close(exc)}) {doing}") from None
    if isinstance(frame, bytes):
        raise Mismatch(f"the runner sent a binary frame {frame[:60]!r}; runner messages are JSON text frames")
    try:
        return json.loads(frame, parse_constant=_reject_constant)
    except ValueError as exc:
        raise Mismatch(f"the runner sent a frame that is not JSON ({exc}): {frame[:200]!r}") from None


def _reject_constant(name: str) -> float:
    """``NaN``/``Infinity`` are not JSON; Python would otherwise accept them."""
    raise ValueError(f"{name} is not valid JSON")


def _expect_close(ws: ClientConnection, expected: dict[str, JSON], wait: float) -> None:
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Mismatch(f"timed out after {wait:g} s waiting for the runner to close with {expected['code']}")
        try:
            frame = ws.recv(timeout=left)
        except TimeoutError:
            continue
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
        shown = _show(frame) if isinstance(frame, str) else repr(frame[:60])
        raise Mismatch(f"expected the runner to close with {expected['code']}, got message {shown}")


def _describe_close(exc: ConnectionClosed) -> str:
    if exc.rcvd is not None:
        return f"code {exc.rcvd.code}" + (f", reason {exc.rcvd.reason!r}" if exc.rcvd.reason else "")
    return "no close frame"


# ---------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="execbox-conformance",
        description="Replay execbox golden transcripts against a runner and check its answers.",
    )
    parser.add_argument("url", help="the runner's WebSocket URL, e.g. ws://127.0.0.1:8765/")
    parser.add_argument(
        "--transcripts",
        type=Path,
        default=DEFAULT_TRANSCRIPTS,
        metavar="DIR",
        help=f"directory of *.jsonl transcripts (default {DEFAULT_TRANSCRIPTS})",
    )
    parser.add_argument(
        "-k", dest="select", metavar="SUBSTRING", help="only transcripts whose file name contains SUBSTRING"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds to wait for each expected runner frame (default {DEFAULT_TIMEOUT:g})",
    )
    return parser


def summary(results: Iterable[Result]) -> str:
    results = list(results)
    passed = sum(result.passed for result in results)
    return f"{passed} passed, {len(results) - passed} failed"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.transcripts.is_dir():
        print(f"execbox-conformance: no transcripts directory {args.transcripts}", file=sys.stderr)
        return 2
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        print("execbox-conformance: --timeout must be a positive number", file=sys.stderr)
        return 2
    results: list[Result] = []
    for path in transcript_paths(args.transcripts, args.select):
        result = run_transcript(args.url, path, timeout=args.timeout)
        print(result.line(), flush=True)
        results.append(result)
    if not results:
        print(f"execbox-conformance: no transcripts in {args.transcripts} match", file=sys.stderr)
    print(summary(results), flush=True)
    return 0 if results and all(result.passed for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
