"""The execbox conformance kit: golden transcripts, and a host that replays them against any runner.

Use it as the ``execbox-conformance`` command (see ``transcripts/README.md``
inside this package), or from Python::

    from execbox_runner_conformance import discover, run_all

    results = run_all("ws://127.0.0.1:8765/", discover())
    assert not any(result.failed for result in results)  # a transcript needing an extension may be skipped
"""

from __future__ import annotations

from .cli import main
from .matcher import Mismatch, match, substitute, substitute_raw
from .report import json_report, junit_xml, summary
from .runner import DEFAULT_TIMEOUT, Result, Target, TargetError, run_all, run_transcript
from .transcript import BUILTIN_TRANSCRIPTS, Transcript, TranscriptError, discover, load_transcript, transcript_paths

__all__ = [
    "BUILTIN_TRANSCRIPTS",
    "DEFAULT_TIMEOUT",
    "Mismatch",
    "Result",
    "Target",
    "TargetError",
    "Transcript",
    "TranscriptError",
    "discover",
    "json_report",
    "junit_xml",
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
