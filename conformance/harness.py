"""The kit's first API, kept stable for existing callers (``execbox_runner_conformance.harness``).

The forms here never raise, so a caller replaying many recorded sessions gets a
verdict on each (``execbox-runner replay`` uses ``runner`` directly, and the
``execbox-conformance`` script is ``cli:main``). New code should import from the package: one
module per concept, ``transcript`` (the format), ``matcher``, ``runner``,
``report`` and ``cli``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from .cli import main
from .report import summary
from .runner import DEFAULT_TIMEOUT, Result, Target, TargetError
from .runner import run_transcript as _run_strictly
from .transcript import BUILTIN_TRANSCRIPTS, Transcript, TranscriptError, load_transcript, transcript_paths

__all__ = ["DEFAULT_TIMEOUT", "DEFAULT_TRANSCRIPTS", "Result", "main", "run_all", "run_transcript", "summary"]

DEFAULT_TRANSCRIPTS: Final = BUILTIN_TRANSCRIPTS


def run_transcript(url: str | Target, path: Path | str, *, timeout: float = DEFAULT_TIMEOUT) -> Result:
    """Play one transcript file; unlike ``runner.run_transcript`` it never raises.

    A malformed file or an unreachable runner is that file's failure, so a
    caller replaying many recorded sessions gets a verdict on each.
    """
    path = Path(path)
    began = time.monotonic()
    try:
        transcript = load_transcript(path)
    except TranscriptError as exc:
        unreadable = Transcript(name=path.stem, description="", steps=(), path=path)
        return Result(unreadable, False, f"invalid transcript: {exc}", seconds=time.monotonic() - began)
    try:
        return _run_strictly(url, transcript, timeout=timeout)
    except TargetError as exc:
        return Result(transcript, False, str(exc), seconds=time.monotonic() - began)


def run_all(
    url: str | Target,
    directory: Path | str = DEFAULT_TRANSCRIPTS,
    *,
    select: str | Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> list[Result]:
    """Every ``*.jsonl`` file in ``directory`` whose name contains ``select``, in name order."""
    return [run_transcript(url, path, timeout=timeout) for path in transcript_paths(directory, select)]


if __name__ == "__main__":
    sys.exit(main())
