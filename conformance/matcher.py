"""Matching runner messages against a transcript's expectations, placeholders included.

The matcher stops at the first difference and says where it is (a JSON path),
so a failing transcript names one concrete thing the runner got wrong.
"""

from __future__ import annotations

import json
import re
from typing import Final, TypeAlias

from .transcript import JSON, is_number

__all__ = ["Bindings", "Mismatch", "match", "show", "substitute", "substitute_raw"]

Bindings: TypeAlias = dict[str, str]

_BIND: Final = re.compile(r"<bind:([A-Za-z0-9_.-]+)>")
_UNIQUE: Final = re.compile(r"<unique:([A-Za-z0-9_.-]+)>")
_RANGE: Final = re.compile(r"<number:(-?[0-9]+(?:\.[0-9]+)?)?\.\.(-?[0-9]+(?:\.[0-9]+)?)?>")
_ONE_OF: Final = re.compile(r"<one-of:([^<>]+)>")


class Mismatch(Exception):
    """The runner did something other than what the transcript expects.

    ``difference`` (also ``str()``) is the first difference on one line, what a
    CI report shows; ``detail`` adds the whole expected and actual messages.
    """

    def __init__(self, difference: str, detail: str = "") -> None:
        super().__init__(difference)
        self.difference = difference
        self.detail = detail

    def at(self, where: str) -> Mismatch:
        """The same mismatch, located (e.g. at a transcript step)."""
        return Mismatch(f"{where}: {self.difference}", self.detail)


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
            raise Mismatch(f"at {path}: expected an object, got {show(actual)}")
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
            raise Mismatch(f"at {path}: expected an array, got {show(actual)}")
        if len(expected) != len(actual):
            raise Mismatch(f"at {path}: expected {len(expected)} item(s), got {len(actual)}")
        for index, (want, got) in enumerate(zip(expected, actual, strict=True)):
            match(want, got, bindings, f"{path}[{index}]")
        return
    if _json_kind(expected) != _json_kind(actual) or expected != actual:
        raise Mismatch(f"at {path}: expected {show(expected)}, got {show(actual)}")


def _placeholder(expected: str, actual: JSON, bindings: Bindings, path: str) -> bool:
    """Apply a placeholder; ``False`` if ``expected`` is an ordinary string after all."""
    if expected == "<any>":
        return True
    if expected == "<string>":
        if not isinstance(actual, str):
            raise Mismatch(f"at {path}: expected any string, got {show(actual)}")
        return True
    if expected == "<number>":
        if not is_number(actual):
            raise Mismatch(f"at {path}: expected any number, got {show(actual)}")
        return True
    if found := _RANGE.fullmatch(expected):
        if not is_number(actual):
            raise Mismatch(f"at {path}: expected a number, got {show(actual)}")
        low, high = (None if bound is None else float(bound) for bound in found.groups())
        if (low is not None and actual < low) or (high is not None and actual > high):
            raise Mismatch(f"at {path}: expected a number in {expected[8:-1]}, got {show(actual)}")
        return True
    if found := _ONE_OF.fullmatch(expected):
        # Where the specification allows several answers, e.g. "internal_error or runtime_error".
        if actual not in found.group(1).split("|"):
            raise Mismatch(f"at {path}: expected one of {found.group(1)}, got {show(actual)}")
        return True
    if found := _BIND.fullmatch(expected) or _UNIQUE.fullmatch(expected):
        name = found.group(1)
        if not isinstance(actual, str):
            raise Mismatch(f"at {path}: expected a string for {name}, got {show(actual)}")
        if name in bindings:
            if bindings[name] != actual:
                raise Mismatch(f"at {path}: expected {name} = {show(bindings[name])}, got {show(actual)}")
            return True
        if expected.startswith("<unique:"):
            # A fresh identifier, e.g. a callId that must differ from every earlier one.
            for other, value in bindings.items():
                if value == actual:
                    raise Mismatch(
                        f"at {path}: expected a new value for {name}, got {show(actual)}, already bound to {other}"
                    )
        bindings[name] = actual
        return True
    return False


def _json_kind(value: JSON) -> str:
    if isinstance(value, bool):
        return "boolean"
    if is_number(value):
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


def show(value: JSON, limit: int = 400) -> str:
    """Compact JSON for a message, shortened, and printable even if it holds lone surrogates."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."
