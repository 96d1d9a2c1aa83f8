"""The execbox runner wire: every message the host and runner exchange.

One JSON text frame carries one message; the ``type`` field tags it. These
msgspec Structs are the single definition of the wire: decoding validates
against them, encoding produces spec-exact JSON (tag first, omitted optional
fields left out), and ``protocol/`` holds the JSON Schema generated from them.

Values that only pass through the runner (tool inputs and results, final
results) are kept as ``msgspec.Raw`` JSON so they are never decoded and
re-encoded on the way.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, TypeAlias

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

ErrorCode: TypeAlias = Literal[
    "timeout",
    "memory_limit",
    "validation_error",
    "tool_error",
    "runtime_error",
    "serialization_error",
    "internal_error",
]
ERROR_CODES: Final[frozenset[str]] = frozenset(ErrorCode.__args__)  # type: ignore[attr-defined]

PositiveNumber = Annotated[float, Meta(gt=0)]
Count = Annotated[int, Meta(ge=0)]


class ToolFailure(Struct, frozen=True):
    """A failing ``tool_result``'s error, taken liberally: any ``code`` string.

    A code outside the stable set reaches the guest as ``tool_error`` (see
    ``session.py``); it is not a reason to fail the execution.
    """

    code: str
    message: str


class ErrorInfo(ToolFailure, frozen=True):
    """A failure the runner reports: one of the stable codes and a human-readable message."""

    code: ErrorCode


class ToolDescriptor(Struct, frozen=True):
    """One tool of a provider manifest; only ``safeName`` matters to the runner."""

    safeName: Annotated[str, Meta(min_length=1)]
    originalName: str | UnsetType = UNSET
    description: str | UnsetType = UNSET


class ProviderManifest(Struct, frozen=True):
    """Metadata for one guest-visible namespace; never a capability."""

    name: Annotated[str, Meta(min_length=1)]
    tools: dict[str, ToolDescriptor]
    types: str | UnsetType = UNSET


class RuntimeOptions(Struct, frozen=True):
    """``ExecutorRuntimeOptions``: the limits of one execution."""

    timeoutMs: PositiveNumber
    memoryLimitBytes: Annotated[int, Meta(gt=0)]
    maxLogLines: Count
    maxLogChars: Count


# ---------------------------------------------------------------- host -> runner


class Execute(Struct, tag="execute", tag_field="type", frozen=True):
    """Provider names, and tool names within a provider, must be unique: each
    becomes one guest global or property, so a repeat would silently shadow."""

    id: str
    code: str
    options: RuntimeOptions
    providers: list[ProviderManifest]

    def __post_init__(self) -> None:
        names = [provider.name for provider in self.providers]
        if len(set(names)) != len(names):
            raise ValueError("provider names must be unique")
        for provider in self.providers:
            tools = [tool.safeName for tool in provider.tools.values()]
            if len(set(tools)) != len(tools):
                raise ValueError(f"tool safeNames of provider {provider.name!r} must be unique")


class Cancel(Struct, tag="cancel", tag_field="type", frozen=True):
    id: str


class ToolResult(Struct, tag="tool_result", tag_field="type", frozen=True):
    """``ok: true`` with no ``result`` means ``undefined``; ``ok: false`` needs ``error``."""

    callId: str
    ok: bool
    result: Raw | UnsetType = UNSET
    error: ToolFailure | UnsetType = UNSET

    def __post_init__(self) -> None:
        if not self.ok and self.error is UNSET:
            raise ValueError("a failing tool_result requires `error`")


HostMessage: TypeAlias = Execute | Cancel | ToolResult

# ---------------------------------------------------------------- runner -> host


class Started(Struct, tag="started", tag_field="type", frozen=True):
    id: str


class ToolCall(Struct, tag="tool_call", tag_field="type", frozen=True):
    """An omitted ``input`` means the guest passed ``undefined``."""

    callId: str
    providerName: str
    safeToolName: str
    input: Raw | UnsetType = UNSET


class Done(Struct, tag="done", tag_field="type", frozen=True):
    """Exactly one ``result`` (omitted for ``undefined``) or ``error``, by ``ok``."""

    id: str
    ok: bool
    durationMs: int
    logs: list[str]
    result: Raw | UnsetType = UNSET
    error: ErrorInfo | UnsetType = UNSET


RunnerMessage: TypeAlias = Started | ToolCall | Done

_host_decoder: Final[msgspec.json.Decoder[HostMessage]] = msgspec.json.Decoder(HostMessage)
_any_decoder: Final = msgspec.json.Decoder()
_raw_decoder: Final = msgspec.json.Decoder(Raw)
_encoder: Final = msgspec.json.Encoder()


class BadMessage(Exception):
    """A frame that is not a valid host message, sorted for the answer it gets.

    ``kind`` is ``"json"`` (not JSON at all), ``"type"`` (no known ``type``) or
    ``"schema"`` (a known type with wrong fields). ``execute_id`` is the id of a
    malformed ``execute`` when one can still be read, so it can get a ``done``.
    """

    def __init__(self, kind: Literal["json", "type", "schema"], detail: str, execute_id: str | None = None):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.execute_id = execute_id


_HOST_TYPES: Final = frozenset({"execute", "cancel", "tool_result"})


def decode_host(data: bytes | str) -> HostMessage:
    """Decode one host frame or raise ``BadMessage`` saying what is wrong with it."""
    try:
        return _host_decoder.decode(data)
    except msgspec.ValidationError as exc:
        detail = str(exc)
    except msgspec.DecodeError as exc:
        raise BadMessage("json", f"invalid JSON: {exc}") from None
    # The frame is JSON but not a valid message: find out how far it got.
    value = _any_decoder.decode(data)
    kind: Literal["type", "schema"] = "schema"
    if not isinstance(value, dict) or value.get("type") not in _HOST_TYPES:
        kind = "type"
        detail = (
            f"unknown message type: {value.get('type')!r}"
            if isinstance(value, dict)
            else "a message must be a JSON object"
        )
    execute_id = None
    if kind == "schema" and value["type"] == "execute" and isinstance(value.get("id"), str):
        execute_id = value["id"]
    raise BadMessage(kind, detail, execute_id)


def encode(message: HostMessage | RunnerMessage) -> bytes:
    return _encoder.encode(message)


def checked_json(data: bytes) -> Raw:
    """Wrap JSON text as ``Raw`` after checking it is exactly one JSON value.

    Raw values are spliced into frames verbatim, so text from a worker must be
    checked before it can reach the host.
    """
    return _raw_decoder.decode(data)
