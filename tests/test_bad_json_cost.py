"""A bad host message costs the daemon what msgspec spends on it, not a token at a time in Python.

The daemon is one thread: a frame that takes it seconds to judge delays every session. The outline
(``messages._outline``) reads a token at a time, so these tests count its tokens instead of timing
anything: a document that is not JSON is refused before the outline reads one, and one nested too
deeply is read only down to the depth that makes it too deep.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from execbox_runner.protocol import messages
from execbox_runner.protocol.messages import MAX_DEPTH, BadJSON, BadMessage, ToolResult, checked_json, decode_host


class CountingPattern:
    """``_TOKEN`` with a count of the tokens it matched."""

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        self.pattern = pattern
        self.matched = 0

    def match(self, data: bytes, pos: int) -> Any:
        self.matched += 1
        return self.pattern.match(data, pos)


@pytest.fixture
def tokens(monkeypatch: pytest.MonkeyPatch) -> CountingPattern:
    counting = CountingPattern(messages._TOKEN)
    monkeypatch.setattr(messages, "_TOKEN", counting)
    return counting


@pytest.mark.parametrize(
    "text",
    [
        b"[" + b"1," * 1_000_000,  # a long array cut short
        b'{"type":"tool_result","callId":"c","ok":true,"result":[' + b"1," * 1_000_000 + b"]]}",
        b'{"type":"execute","id":"e","code":"' + b"a" * 1_000_000 + b'\\x"}',  # a bad escape at the end
        b'{"type":"cancel","id":"e"} trailing',
    ],
)
def test_a_document_that_is_not_json_is_refused_before_the_outline(tokens: CountingPattern, text: bytes) -> None:
    with pytest.raises(BadMessage) as refused:
        decode_host(text)
    assert refused.value.kind == "json"
    assert tokens.matched == 0


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 5 * MAX_DEPTH])
def test_a_message_too_deep_is_read_down_to_the_depth_that_makes_it_so(tokens: CountingPattern, depth: int) -> None:
    text = b'{"type":"execute","id":"deep","code":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(BadMessage) as refused:
        decode_host(text)
    assert (refused.value.kind, refused.value.execute_id) == ("schema", "deep")
    assert tokens.matched < MAX_DEPTH + 20


def test_the_shallow_members_after_a_deep_one_are_still_read(tokens: CountingPattern) -> None:
    """The execute's id comes after the deep member: it is read all the same, so the execute gets its done."""
    depth = MAX_DEPTH + 1
    text = b'{"type":"execute","code":' + b"[" * depth + b"]" * depth + b',"id":"late"}'
    with pytest.raises(BadMessage) as refused:
        decode_host(text)
    assert (refused.value.kind, refused.value.execute_id) == ("schema", "late")


def test_worker_json_too_deep_is_refused_at_that_depth(tokens: CountingPattern) -> None:
    depth = 3 * MAX_DEPTH
    with pytest.raises(BadJSON):
        checked_json(b"[" * depth + b"]" * depth)
    assert tokens.matched < MAX_DEPTH + 20


@pytest.mark.parametrize(
    "text",
    [b'"\\ud800"', b'["\\udc00x"]', b'"\\\\ud800"', b'{"a":"\\ud83d\\ude00","b":"\\udfff"}'],
)
def test_lone_surrogate_escapes_are_still_json(text: bytes) -> None:
    assert bytes(checked_json(text)) == text


@pytest.mark.parametrize(
    ("text", "kind", "execute_id"),
    [
        (b'{"type":"cancel","id":[' + b"1," * 1_000_000 + b"1]}", "schema", None),
        (b'{"type":"tool_result","callId":5,"ok":true,"result":[' + b"1," * 1_000_000 + b"1]}", "schema", None),
        (
            b'{"type":"execute","id":"e","code":5,"options":{},"providers":['
            + b'{"name":"p","tools":{}},' * 100_000
            + b'{"name":"q","tools":{}}]}',
            "schema",
            "e",
        ),
        (b'{"type":"nothing","data":[' + b"1," * 1_000_000 + b"1]}", "type", None),
        (b"[" + b"1," * 1_000_000 + b"1]", "type", None),
    ],
)
def test_json_of_the_wrong_shape_is_answered_without_the_outline(
    tokens: CountingPattern, text: bytes, kind: str, execute_id: str | None
) -> None:
    """msgspec reads it, and finds its members itself: the outline read a million tokens of it (seconds
    of the daemon's one thread, for every session, at each such frame)."""
    with pytest.raises(BadMessage) as refused:
        decode_host(text)
    assert (refused.value.kind, refused.value.execute_id) == (kind, execute_id)
    assert tokens.matched == 0


def test_json_of_the_wrong_shape_with_invalid_json_after_the_wrong_field_is_invalid_json() -> None:
    """msgspec stops at the wrong field; what follows it is judged too."""
    with pytest.raises(BadMessage) as refused:
        decode_host(b'{"type":"cancel","id":5,"x":[1,}')
    assert refused.value.kind == "json"
    with pytest.raises(BadMessage) as refused:
        decode_host(b"[5, oops")
    assert refused.value.kind == "json"


def test_a_large_tool_result_with_a_lone_surrogate_is_taken_without_the_outline(tokens: CountingPattern) -> None:
    """As JavaScript hosts send half an emoji: msgspec refuses the escape, and the outline read the
    million tokens of the result to find the members (seconds of the daemon's one thread)."""
    result = b'["\\ud800 \\\\ud800",' + b"1," * 1_000_000 + b'{"k":"\\udc00"}]'
    message = decode_host(b'{"type":"tool_result", "callId" : "c",\n"ok":true,"result":' + result + b"}")
    assert isinstance(message, ToolResult)
    assert (message.callId, message.ok, bytes(message.result)) == ("c", True, result)
    assert tokens.matched < 20  # the top level's


@pytest.mark.parametrize(
    ("text", "detail", "execute_id"),
    [
        (b'{"type":"cancel","id":"\\ud800","pad":[' + b"1," * 1_000_000 + b"1]}", "a lone surrogate", None),
        (b'{"type":"execute","id":"e","code":"\\udfff","x":[' + b"1," * 1_000_000 + b"1]}", "a lone surrogate", "e"),
    ],
)
def test_a_lone_surrogate_where_text_must_be_well_formed_is_refused_without_the_outline(
    tokens: CountingPattern, text: bytes, detail: str, execute_id: str | None
) -> None:
    with pytest.raises(BadMessage) as refused:
        decode_host(text)
    assert (refused.value.kind, refused.value.execute_id) == ("schema", execute_id)
    assert refused.value.detail.startswith(detail)
    assert tokens.matched < 20  # the top level's


@pytest.mark.parametrize(
    "text",
    [
        b'{"type":"tool_result","callId":"c","ok":true,"result":["\\ud800",1,2],"result":"\\udc00"}',
        b'{"type":"tool_result","callId":"c","ok":true,"result":"\\ud800","result":["\\udc00",1,2]}',
    ],
)
def test_a_repeated_member_with_a_lone_surrogate_is_the_last_one_as_msgspec_has_it(text: bytes) -> None:
    """The walk knows only the last value's length: a repeated member is the outline's to read."""
    message = decode_host(text)
    assert isinstance(message, ToolResult)
    assert bytes(message.result) == text[text.rindex(b'"result":') + 9 : -1]
