"""protocol/ stays in sync with the msgspec types, and describes real messages."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from execbox_runner.protocol import schema

SCHEMA_FILE = Path(__file__).parent.parent / "protocol" / "execbox-runner.schema.json"
SPEC_SUCCESS = [
    {
        "type": "execute",
        "id": "exec-1",
        "code": "1",
        "options": {"timeoutMs": 1000, "memoryLimitBytes": 67108864, "maxLogLines": 100, "maxLogChars": 64000},
        "providers": [
            {
                "name": "tools",
                "tools": {"echo": {"safeName": "echo", "originalName": "echo", "description": "Echo input"}},
                "types": "declare namespace tools { ... }",
            }
        ],
    },
    {"type": "started", "id": "exec-1"},
    {"type": "tool_call", "callId": "call-1", "providerName": "tools", "safeToolName": "echo", "input": {"ok": True}},
    {"type": "tool_call", "callId": "call-2", "providerName": "tools", "safeToolName": "echo"},
    {"type": "tool_result", "callId": "call-1", "ok": True, "result": {"ok": True}},
    {"type": "tool_result", "callId": "call-1", "ok": False, "error": {"code": "tool_error", "message": "no"}},
    {"type": "cancel", "id": "exec-1"},
    {"type": "done", "id": "exec-1", "ok": True, "durationMs": 3, "logs": [], "result": True},
    {
        "type": "done",
        "id": "exec-2",
        "ok": False,
        "durationMs": 1005,
        "logs": [],
        "error": {"code": "timeout", "message": "Execution timed out"},
    },
]


def test_schema_file_is_generated_from_the_types() -> None:
    assert SCHEMA_FILE.read_text() == schema.render(), (
        "regenerate: python -m execbox_runner.protocol.schema > protocol/execbox-runner.schema.json"
    )


@pytest.mark.parametrize("message", SPEC_SUCCESS, ids=lambda m: m["type"])
def test_spec_messages_validate(message: dict) -> None:
    jsonschema.validate(message, json.loads(SCHEMA_FILE.read_text()))


@pytest.mark.parametrize(
    "message",
    [
        {"type": "hello"},
        {"type": "done", "id": "x", "ok": True, "logs": []},
        {
            "type": "done",
            "id": "x",
            "ok": False,
            "durationMs": 1,
            "logs": [],
            "error": {"code": "bogus", "message": ""},
        },
    ],
)
def test_invalid_messages_do_not_validate(message: dict) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(message, json.loads(SCHEMA_FILE.read_text()))
