"""What a run reports as a whole: totals for people, JSON for scripts, JUnit XML for CI systems.

Every format carries the same facts (name, verdict, first difference, time),
so CI shows what a person sees in the terminal (``Result.line()``).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from .runner import Result
from .transcript import JSON, Transcript

__all__ = ["SUITE", "describe", "json_report", "junit_xml", "summary"]

#: The name of the JUnit test suite and the prefix of its class names.
SUITE: Final = "execbox-conformance"

# Characters XML 1.0 cannot carry at all, not even escaped (a runner's bytes may hold them).
_NOT_XML: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def summary(results: Sequence[Result]) -> str:
    passed, failed, skipped = _counts(results)
    return f"{passed} passed, {failed} failed" + (f", {skipped} skipped" if skipped else "")


def _counts(results: Sequence[Result]) -> tuple[int, int, int]:
    """How many passed, failed and were skipped."""
    passed, failed = sum(result.passed for result in results), sum(result.failed for result in results)
    return passed, failed, len(results) - passed - failed


def describe(transcript: Transcript) -> dict[str, JSON]:
    """A transcript's identity, as ``--list --json`` and the results show it."""
    return {
        "name": transcript.name,
        "description": transcript.description,
        "file": str(transcript.path),
        "builtin": transcript.builtin,
        "extensions": list(transcript.extensions),
    }


def json_report(results: Sequence[Result], url: str) -> dict[str, JSON]:
    """The whole run as one JSON document; ``failure`` is ``null`` for a transcript that passed or was
    skipped, ``skipped`` the reason it was not run (``null`` for one that ran)."""
    passed, failed, skipped = _counts(results)
    return {
        "url": url,
        "ok": passed > 0 and failed == 0,
        "passed": passed,
        "failed": failed,
        "skipped": skipped,
        "seconds": round(sum(result.seconds for result in results), 6),
        "results": [
            {
                **describe(result.transcript),
                "passed": result.passed,
                "seconds": round(result.seconds, 6),
                "failure": {"message": result.difference, "detail": result.detail} if result.failed else None,
                "skipped": result.skipped or None,
            }
            for result in results
        ],
    }


def junit_xml(results: Sequence[Result], url: str) -> bytes:
    """A JUnit XML report: one ``testcase`` per transcript, the first difference as the failure message."""
    _, failures, skipped = _counts(results)
    totals = {
        "tests": str(len(results)),
        "failures": str(failures),
        "errors": "0",
        "skipped": str(skipped),
        "time": f"{sum(result.seconds for result in results):.3f}",
    }
    root = ET.Element("testsuites", {"name": SUITE, **totals})
    suite = ET.SubElement(
        root, "testsuite", {"name": SUITE, **totals, "timestamp": datetime.now(UTC).isoformat(timespec="seconds")}
    )
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", {"name": "url", "value": _xml_text(url)})
    for result in results:
        case = ET.SubElement(
            suite,
            "testcase",
            {
                "classname": f"{SUITE}.{'builtin' if result.transcript.builtin else 'user'}",
                "name": _xml_text(result.name),
                "file": _xml_text(str(result.transcript.path)),
                "time": f"{result.seconds:.3f}",
            },
        )
        if result.skipped:
            ET.SubElement(case, "skipped", {"message": _xml_text(result.skipped)})
        elif not result.passed:
            failure = ET.SubElement(case, "failure", {"message": _xml_text(result.difference), "type": "mismatch"})
            failure.text = _xml_text(result.reason)
    ET.indent(root)
    document: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return document + b"\n"


def _xml_text(text: str) -> str:
    """``text`` with what XML cannot hold (control characters, lone surrogates) shown as escapes."""
    return _NOT_XML.sub(lambda found: f"\\u{ord(found.group()):04x}", text)
