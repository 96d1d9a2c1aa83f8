"""Property tests of what crosses the boundary: serialization and log truncation."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .guestkit import error, run, value

SAFE_INTEGERS = st.integers(min_value=-(2**53), max_value=2**53)
json_values = st.recursive(
    st.none() | st.booleans() | SAFE_INTEGERS | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def as_js(value: Any) -> Any:
    """JSON as JavaScript sees it: one number type (5e16 and 50000000000000000 are one value)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, list):
        return [as_js(item) for item in value]
    return {key: as_js(item) for key, item in value.items()}


@FAST
@given(json_values)
def test_json_values_round_trip_host_to_guest_to_host(data: Any) -> None:
    """A tool result comes back unchanged as the final result and as a tool input."""
    seen: list = []
    host = lambda provider, tool, given_input: data if tool == "fail" else given_input
    finished = run("const v = await tools.fail(); await tools.echo(v); v", host=host, record=seen)
    assert as_js(value(finished)) == as_js(data)
    assert as_js(seen[1][2]) == as_js(data)


BAD_LEAVES = [
    "1n",
    "NaN",
    "Infinity",
    "-Infinity",
    "Symbol('s')",
    "(() => 1)",
    "new Map()",
    "new Date(0)",
    "new (class K {})()",
    "new Set([1])",
]


@FAST
@given(json_values, st.sampled_from(BAD_LEAVES), st.lists(st.sampled_from(["a", 0]), max_size=4))
def test_a_bad_value_anywhere_is_a_serialization_error(data: Any, bad: str, path: list) -> None:
    # Build `data` with the bad leaf placed under `path` (objects for "a", arrays for 0).
    source = "__BAD__"
    for step in reversed(path):
        source = f"{{ a: {source} }}" if step == "a" else f"[{source}]"
    code = f"const good = {json.dumps(data)}; [good, {source}]".replace("__BAD__", bad)
    assert error(run(code))[0] == "serialization_error"
    # The same value as a tool input rejects the guest's promise and sends no tool_call.
    seen: list = []
    assert error(run(f"await tools.echo({code.split('; ', 1)[1]})".replace("const good", "good"), record=seen))[0] in (
        "serialization_error",
        "runtime_error",
    )
    assert seen == []


@FAST
@given(json_values, st.lists(st.sampled_from(["a", 0]), max_size=4))
def test_nested_undefined_serializes_as_json_stringify_does(data: Any, path: list) -> None:
    """Final results and tool inputs with undefined anywhere below the top match JSON.stringify."""
    source = "undefined"
    for step in reversed(path):
        source = f"{{ a: {source}, b: 1 }}" if step == "a" else f"[{source}, 1]"
    value_source = f"[{json.dumps(data)}, {source}]"
    expected = json.loads(value(run(f"JSON.stringify({value_source})")))
    assert value(run(value_source)) == expected
    seen: list = []
    run(f"await tools.echo({value_source})", record=seen)
    assert seen == [("tools", "echo", expected)]


def utf16_len(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def utf16_clip(text: str, units: int) -> str:
    clipped = text.encode("utf-16-le")[: 2 * units].decode("utf-16-le", errors="surrogatepass")
    return clipped.encode("utf-16", errors="surrogatepass").decode("utf-16", errors="replace")


def truncate_model(lines: list[str], max_lines: int, max_chars: int) -> list[str]:
    """The specification's rule, written independently of the runner's JavaScript."""
    kept: list[str] = []
    budget = max_chars
    for line in lines[:max_lines]:
        if budget <= 0:
            break
        if utf16_len(line) <= budget:
            kept.append(line)
            budget -= utf16_len(line)
        else:
            kept.append(utf16_clip(line, budget))
            break
    return kept


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(alphabet=st.sampled_from("ab é😀\t"), max_size=12), max_size=12),
    st.integers(0, 14),
    st.integers(0, 60),
)
def test_log_truncation_matches_the_specification(lines: list[str], max_lines: int, max_chars: int) -> None:
    code = "".join(f"console.log({json.dumps(line)});" for line in lines)
    assert run(code, lines=max_lines, chars=max_chars).logs == truncate_model(lines, max_lines, max_chars)
