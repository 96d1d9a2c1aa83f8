"""The transcript format: loading ``*.jsonl`` files strictly, and finding the ones a run selects.

The format is documented once, in ``transcripts/README.md``; this module is its
executable definition. It is strict so that a typo in a transcript fails loudly
instead of silently passing.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeAlias

__all__ = [
    "BUILTIN_TRANSCRIPTS",
    "JSON",
    "STEP_KINDS",
    "Step",
    "Transcript",
    "TranscriptError",
    "discover",
    "is_number",
    "load_transcript",
    "loads_strict",
    "transcript_paths",
]

_PACKAGE: Final = Path(__file__).resolve().parent
#: The golden transcripts: inside the installed package as data, or next to ``conformance/`` in a
#: source checkout (``python -m conformance``), where they keep their place in the repository.
BUILTIN_TRANSCRIPTS: Final = (
    _PACKAGE / "transcripts" if (_PACKAGE / "transcripts").is_dir() else _PACKAGE.parent / "transcripts"
)

JSON: TypeAlias = Any
# The transcript format this kit reads: a header's "format" (1 where it has none). A later kit that
# changes what steps mean raises it, and this one refuses such transcripts rather than misread them.
FORMAT: Final = 1

STEP_KINDS: Final = frozenset(
    {"host", "host_raw", "host_binary", "runner", "runner_close", "runner_silent_ms", "sleep_ms", "host_close"}
)


class TranscriptError(Exception):
    """A transcript file is malformed or missing: a mistake in the test, not in the runner."""


@dataclass(frozen=True)
class Step:
    """One line after the header: something the host does, or something the runner must do."""

    kind: str
    value: JSON
    line: int
    timeout: float | None = None  # a per-step override of the wait, in seconds


@dataclass(frozen=True)
class Transcript:
    """One scripted host session; ``builtin`` tells the golden transcripts from a user's own."""

    name: str
    description: str
    steps: tuple[Step, ...]
    path: Path
    builtin: bool = False
    extensions: tuple[str, ...] = ()  # protocol extensions it needs; skipped on runners without them


def loads_strict(text: str | bytes) -> JSON:
    """``json.loads`` without Python's extensions: ``NaN`` and ``Infinity`` are not JSON."""
    return json.loads(text, parse_constant=_reject_constant)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def is_number(value: JSON) -> bool:
    """A JSON number: ``bool`` is an ``int`` in Python but not a number in JSON."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def load_transcript(path: Path | str) -> Transcript:
    """Parse and validate one transcript file; ``TranscriptError`` names the file and line at fault."""
    path = Path(path)
    try:
        return _parse(path)
    except TranscriptError as exc:
        raise TranscriptError(f"{path}: {exc}") from None


def _parse(path: Path) -> Transcript:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TranscriptError(f"cannot read it: {exc}") from None
    objects: list[tuple[int, dict[str, JSON]]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            value = loads_strict(raw)
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
    written = header.get("format", FORMAT)
    if not isinstance(written, int) or isinstance(written, bool) or written < 1:
        raise TranscriptError("the header's format must be a positive integer")
    if written > FORMAT:
        raise TranscriptError(
            f"it is in transcript format {written}, newer than {FORMAT}: upgrade execbox-runner to read it"
        )
    extensions = header.get("extensions", [])
    if not isinstance(extensions, list) or not all(isinstance(e, str) and e for e in extensions):
        raise TranscriptError("the header's extensions must be a list of extension names")
    steps = tuple(_parse_step(number, value) for number, value in objects[1:])
    if not steps:
        raise TranscriptError("a transcript needs at least one step")
    builtin = path.resolve().parent == BUILTIN_TRANSCRIPTS
    return Transcript(name, description, steps, path, builtin, tuple(extensions))


def _parse_step(number: int, value: dict[str, JSON]) -> Step:
    timeout_ms = value.get("timeout_ms")
    kinds = [key for key in value if key != "timeout_ms"]
    if len(kinds) != 1 or kinds[0] not in STEP_KINDS:
        raise TranscriptError(
            f"line {number}: a step has exactly one of {sorted(STEP_KINDS)} (plus optional timeout_ms), got {sorted(value)}"
        )
    kind = kinds[0]
    body = value[kind]
    if timeout_ms is not None and (
        not is_number(timeout_ms) or timeout_ms <= 0 or kind not in ("runner", "runner_close")
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
        "runner_silent_ms": is_number(body) and body >= 0,
        "sleep_ms": is_number(body) and body >= 0,
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


def transcript_paths(directory: Path | str, select: str | Sequence[str] = ()) -> list[Path]:
    """The ``*.jsonl`` files in ``directory`` in name order, keeping those whose file name contains any of ``select``.

    An empty ``select`` keeps every file; a single string is one substring, not a set of characters.
    """
    substrings = (select,) if isinstance(select, str) else tuple(select)
    paths = sorted(Path(directory).glob("*.jsonl"))
    return [path for path in paths if not substrings or any(part in path.name for part in substrings)]


def discover(
    directories: Sequence[Path | str] = (), *, builtin: bool = True, select: str | Sequence[str] = ()
) -> list[Transcript]:
    """Load the selected transcripts: the built-in ones (unless ``builtin`` is false), then each directory's.

    Everything is loaded before anything runs, so a malformed file, a missing
    or empty directory, or two transcripts with one name stop the run at once
    (``TranscriptError``) instead of failing halfway through it.
    """
    sources = [BUILTIN_TRANSCRIPTS] if builtin else []
    for directory in map(Path, directories):
        if not directory.is_dir():
            raise TranscriptError(f"no transcripts directory {directory}")
        if not transcript_paths(directory):
            raise TranscriptError(f"no *.jsonl transcripts in {directory}")
        sources.append(directory)
    found: dict[str, Transcript] = {}
    for directory in sources:
        for path in transcript_paths(directory, select):
            transcript = load_transcript(path)
            if (other := found.get(transcript.name)) is not None:
                raise TranscriptError(
                    f"two transcripts are named {transcript.name!r}: {other.path} and {path}"
                    + (" (rename yours, or run only yours with --no-builtin)" if other.builtin else "")
                )
            found[transcript.name] = transcript
    return list(found.values())
