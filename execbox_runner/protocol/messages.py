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

import json
import re
from collections.abc import Callable
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

# Limits are JavaScript numbers: larger than 2**53 they are not exact, and an
# unbounded one (1e400 parses as infinity) would reach the worker as a budget.
MAX_SAFE_INTEGER: Final = 2**53 - 1
PositiveNumber = Annotated[float, Meta(gt=0, le=MAX_SAFE_INTEGER)]
# A whole number in either JSON spelling: JavaScript has one number type, so 67108864.0 and 1e8 are
# the integers they write (as some hosts' encoders do, and as JSON Schema's "integer" allows).
PositiveWholeNumber = (
    Annotated[int, Meta(gt=0, le=MAX_SAFE_INTEGER)] | Annotated[float, Meta(gt=0, le=MAX_SAFE_INTEGER, multiple_of=1)]
)
# A log limit may be any finite number a JavaScript host can write (hosts pass
# Number.MAX_SAFE_INTEGER or more to mean "no limit"): the session cuts it to a
# whole number and to the largest this runner keeps.
LogLimit = Annotated[float, Meta(ge=0)]


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
    memoryLimitBytes: PositiveWholeNumber
    maxLogLines: LogLimit
    maxLogChars: LogLimit


# ---------------------------------------------------------------- host -> runner


# The globals JavaScript fixes (not configurable), which no provider can become.
FIXED_GLOBALS: Final = ("undefined", "NaN", "Infinity")


class Execute(Struct, tag="execute", tag_field="type", frozen=True):
    """Provider names, and tool names within a provider, must be unique: each
    becomes one guest global or property, so a repeat would silently shadow.
    A provider cannot be named undefined, NaN or Infinity, globals JavaScript fixes."""

    id: str
    code: str
    options: RuntimeOptions
    providers: list[ProviderManifest]

    def __post_init__(self) -> None:
        names = [provider.name for provider in self.providers]
        if len(set(names)) != len(names):
            raise ValueError("provider names must be unique")
        if fixed := [name for name in FIXED_GLOBALS if name in names]:
            raise ValueError(
                f"a provider cannot be named {fixed[0]}: JavaScript's global {fixed[0]} cannot be replaced"
            )
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


class Log(Struct, tag="log", tag_field="type", frozen=True):
    """Live logs, an extension a host opts into at the handshake (``extensions``): lines the guest
    of execution ``id`` logged, sent as they arrive, before its ``done``. Every line sent is also in
    ``done.logs``, in the same order, cut by the same limits: the lines of an execution's ``log``
    messages, in order, are exactly its ``done.logs``."""

    id: str
    lines: list[str]


RunnerMessage: TypeAlias = Started | ToolCall | Log | Done

_host_decoder: Final[msgspec.json.Decoder[HostMessage]] = msgspec.json.Decoder(HostMessage)
_raw_decoder: Final = msgspec.json.Decoder(Raw)
_members_decoder: Final = msgspec.json.Decoder(dict[str, Raw])
_encoder: Final = msgspec.json.Encoder()

# Deepest JSON the runner passes on (a tool result, a guest's result or tool
# input). msgspec decodes recursively and gives up near Python's recursion
# limit (about 1,000 levels), so deeper values are checked by ``_outline``,
# which keeps its own stack; QuickJS parses this depth on the guest's stack.
MAX_DEPTH: Final = 10_000


class BadJSON(ValueError):
    """Text that is not one JSON value the runner accepts: not UTF-8, not JSON, or
    nested deeper than ``MAX_DEPTH``."""


TOO_DEEP: Final = f"JSON nested deeper than {MAX_DEPTH} levels"


class BadMessage(Exception):
    """A frame that is not a valid host message, sorted for the answer it gets.

    ``kind`` is ``"json"`` (not UTF-8 JSON at all), ``"type"`` (no known
    ``type``) or ``"schema"`` (a known type with wrong fields, or nested deeper
    than ``MAX_DEPTH``). ``execute_id`` is the id of a malformed ``execute`` when
    one can still be read, so it can get a ``done``.
    """

    def __init__(self, kind: Literal["json", "type", "schema"], detail: str, execute_id: str | None = None):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.execute_id = execute_id


_HOST_TYPES: Final = frozenset({"execute", "cancel", "tool_result"})


def decode_host(data: bytes | str) -> HostMessage:
    """Decode one host frame or raise ``BadMessage`` saying what is wrong with it.

    msgspec takes every ordinary frame, and finds the members of one of the wrong
    shape. What it cannot read is judged again on a non-recursive outline: deep
    JSON, lone surrogates (which JavaScript strings hold) and out-of-range numbers
    must get a precise answer, never an exception.
    """
    raw = data.encode() if isinstance(data, str) else data
    try:
        _check_utf8(raw)  # msgspec does not check the text it keeps as Raw
        return _host_decoder.decode(raw)
    except msgspec.ValidationError as exc:
        detail: str | None = str(exc)
    except (msgspec.DecodeError, RecursionError, BadJSON):
        detail = None  # maybe valid all the same: the outline decides
    members, deep = _top_level(raw, shaped=detail is not None)
    if members is None:
        raise BadMessage("type", "a message must be a JSON object")
    kind = _string(members.get("type"))
    if kind not in _HOST_TYPES:
        shown = _clip(members["type"].decode()) if "type" in members else "none"
        raise BadMessage("type", f"unknown message type: {shown}")
    if deep:
        detail = TOO_DEEP
    elif detail is None:
        try:
            return _decode_members(members)
        except (msgspec.ValidationError, RecursionError, UnicodeEncodeError) as exc:
            detail = _detail(exc)
    execute_id = _string(members.get("id")) if kind == "execute" else None
    raise BadMessage("schema", detail, execute_id)


def _top_level(data: bytes, *, shaped: bool) -> tuple[dict[str, bytes] | None, bool]:
    """The JSON text of each member of the top-level object (None for any other value), and whether
    it nests deeper than ``MAX_DEPTH``; ``BadMessage`` if it is not JSON.

    ``shaped``: msgspec read ``data`` as far as a field of the wrong type, so it can most often
    find the members (and say it is JSON) itself. The outline reads a token at a time, seconds of
    the daemon's one thread for megabytes: it reads only what msgspec cannot (lone surrogates, deep
    or invalid JSON), and what follows the wrong field is not known to be JSON."""
    if shaped:
        try:
            return {key: bytes(value) for key, value in _members_decoder.decode(data).items()}, False
        except msgspec.ValidationError:  # not an object (nor JSON, if msgspec can say so)
            if (error := _json_error(data)) is not None:
                raise BadMessage("json", f"invalid JSON ({error})") from None
            return None, False
        except (msgspec.DecodeError, RecursionError):
            pass
    elif (members := _members_around_surrogates(data)) is not None:
        return members, False

    def enough(spans: dict[str, tuple[int, int]]) -> bool:
        """Whether a message too deep to take says what its answer needs: its type, an execute's id."""
        return "type" in spans and ("id" in spans or _string(data[slice(*spans["type"])]) != "execute")

    try:
        spans, deep = _outline(data, enough)
    except BadJSON as exc:
        raise BadMessage("json", str(exc)) from None
    return (None if spans is None else {key: data[start:end] for key, (start, end) in spans.items()}), deep


def _members_around_surrogates(data: bytes) -> dict[str, bytes] | None:
    """The members of ``data``, a top-level object that msgspec refused only for its lone surrogate
    escapes (which JavaScript strings hold: a large tool result may well have one); None for any
    other ``data``, or one with a repeated member, for the outline to read.

    Its surrogate escapes replaced, msgspec reads it (``_json_error``), and says how long each
    member's value is, in ``data`` too: a walk of the top level alone then finds them all."""
    try:
        _check_utf8(data)
    except BadJSON:
        return None
    alike = _without_surrogates(data)
    try:
        lengths = {key: len(value) for key, value in _members_decoder.decode(alike).items()}
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    # Each member is read once, its length taken: a repeated one (msgspec said how long its last
    # value is, not the others') is either found again or throws the walk off its tokens.
    members: dict[str, bytes] = {}
    token = _TOKEN.match(alike, 0)
    while token is not None and token.lastgroup in ("open", "comma"):
        key = _TOKEN.match(alike, token.end())
        if key is None or key.lastgroup != "string":
            return members if not lengths and key is not None and key.lastgroup == "close" else None
        length = lengths.pop(json.loads(alike[key.start("string") : key.end()]), None)
        colon = _TOKEN.match(alike, key.end())
        if length is None or colon is None or colon.lastgroup != "colon":
            return None
        start = _SPACES.match(alike, colon.end()).end()  # type: ignore[union-attr]  # it matches anywhere
        members[json.loads(data[key.start("string") : key.end()])] = data[start : start + length]
        token = _TOKEN.match(alike, start + length)
        if token is not None and token.lastgroup == "close":
            return members if not lengths else None
    return None


def _decode_members(members: dict[str, bytes]) -> HostMessage:
    """The message, decoded one top-level member at a time.

    A ``result`` stays the JSON text the host sent (lone surrogates and depth
    included: it reaches the guest unchanged). Every other member is a small
    value: its strings must be well-formed Unicode, as they travel on as text,
    except an error's ``message``, which reaches the guest unchanged too.
    """
    fields: dict[str, object] = {}
    for key, text in members.items():
        if key == "result":
            fields[key] = Raw(text)
            continue
        value = json.loads(text)
        if key == "error" and isinstance(value, dict) and isinstance(value.get("message"), str):
            # The message reaches the guest as sent, lone surrogates included (ipc.Settle.reject).
            _encoder.encode({**value, "message": ""})
        else:
            _encoder.encode(value)  # raises UnicodeEncodeError on a lone surrogate
        fields[key] = value
    message: HostMessage = msgspec.convert(fields, HostMessage)
    return message


def _detail(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "a field nests too deeply"
    if isinstance(exc, UnicodeEncodeError):
        return "a lone surrogate in a text field"
    return str(exc)


def _string(text: bytes | None) -> str | None:
    """A member's JSON ``text`` if it is a well-formed string, else None."""
    if text is None or not text.startswith(b'"'):
        return None
    value = json.loads(text)
    assert isinstance(value, str)
    return value if value == well_formed(value) else None


def well_formed(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (as ``String.prototype.toWellFormed``)."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def _clip(text: str) -> str:
    return text if len(text) <= 40 else text[:40] + "..."


_TOKEN: Final = re.compile(
    rb"""[ \t\n\r]*+(?:
      (?P<string>"(?:[^"\\\x00-\x1f]++|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*+")
    | (?P<scalar>-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?(?:[eE][-+]?[0-9]++)?|true|false|null)
    | (?P<open>[\[{]) | (?P<close>[\]}]) | (?P<comma>,) | (?P<colon>:))""",
    re.VERBOSE,
)
_SPACE: Final = re.compile(rb"[ \t\n\r]*+\Z")
_SPACES: Final = re.compile(rb"[ \t\n\r]*+")


def _outline(
    data: bytes, enough: Callable[[dict[str, tuple[int, int]]], bool] = lambda members: True
) -> tuple[dict[str, tuple[int, int]] | None, bool]:
    """Check ``data`` is one JSON value, without recursion, at any depth.

    Returns the byte spans of the members of a top-level object (None for any
    other value), so a caller can decode them one by one, and whether the value
    nests deeper than ``MAX_DEPTH``: then the outline stops there if the members
    read so far are ``enough``, else it reads on for the shallow members (such as
    an execute's ``id``). Lone surrogate escapes are JSON; invalid UTF-8 is not.

    msgspec judges first whether ``data`` is JSON at all (``_json_error``): the
    outline reads a token at a time, and a large document that is not JSON held
    the daemon, and every session on it, for seconds.
    """
    _check_utf8(data)
    error = _json_error(data)
    if error is not None:
        raise BadJSON(f"invalid JSON ({error})")
    deep = False
    stack = bytearray()  # the open containers, b"[" or b"{" (at most one byte per byte of data)
    members: dict[str, tuple[int, int]] | None = None
    key, start = "", 0  # the top-level member being read
    want = "value"  # value, first (value or "]"), key, first_key (key or "}"), colon, next ("," or close)
    pos = 0
    while want != "end":
        token = _TOKEN.match(data, pos)
        if token is None:
            raise BadJSON(f"invalid JSON at byte {pos}")
        kind, pos = token.lastgroup, token.end()
        at = token.start(kind or 0)
        if want in ("value", "first") and kind in ("string", "scalar", "open"):
            if len(stack) == 1 and members is not None:
                start = at
            if kind == "open":
                if len(stack) == MAX_DEPTH and not deep:
                    deep = True
                    if members is None or enough(members):
                        return members, deep
                stack += data[at : at + 1]
                if len(stack) == 1 and stack[0] == ord("{"):
                    members = {}
                want = "first" if stack[-1] == ord("[") else "first_key"
                continue
        elif want in ("key", "first_key") and kind == "string":
            if len(stack) == 1 and members is not None:
                key = json.loads(data[at:pos])
            want = "colon"
            continue
        elif want == "colon" and kind == "colon":
            want = "value"
            continue
        elif want == "next" and kind == "comma":
            want = "value" if stack[-1] == ord("[") else "key"
            continue
        elif kind == "close" and (
            (want in ("next", "first") and stack[-1:] == b"[") or (want in ("next", "first_key") and stack[-1:] == b"{")
        ):
            del stack[-1]
        else:
            raise BadJSON(f"invalid JSON at byte {at}")
        # A value ended (a scalar, or a container just closed).
        if len(stack) == 1 and members is not None:
            members[key] = (start, pos)
        want = "next" if stack else "end"
    if _SPACE.match(data, pos) is None:
        raise BadJSON(f"invalid JSON at byte {pos}: trailing data")
    return members, deep


# A surrogate escape, lone or paired: replaced by another six-byte escape, JSON stays JSON (or not).
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _without_surrogates(data: bytes) -> bytes:
    """``data`` with every surrogate escape made ``\\u0041``: of the same length, each value where it was."""
    return _SURROGATE_ESCAPE.sub(rb"\\u0041", data)


def _json_error(data: bytes) -> str | None:
    """msgspec's reason why ``data`` is not JSON, lone surrogate escapes allowed; None when it is, or
    when it nests too deeply for msgspec to say (the outline decides then).

    An escape of the form ``\\uD800`` becomes ``\\u0041`` whether it is one (a surrogate, lone or
    not) or follows an escaped backslash (plain text): the text is JSON exactly when it was,
    but for its surrogates, which msgspec refuses and JavaScript strings hold."""
    try:
        _raw_decoder.decode(_without_surrogates(data))
    except msgspec.DecodeError as exc:
        return str(exc)
    except RecursionError:
        pass  # too deep for msgspec: the outline judges it
    return None


def _check_utf8(data: bytes) -> None:
    if not data.isascii():
        try:
            data.decode()
        except UnicodeDecodeError as exc:
            raise BadJSON(f"invalid UTF-8 at byte {exc.start}") from None


def encode(message: HostMessage | RunnerMessage) -> bytes:
    return _encoder.encode(message)


def checked_json(data: bytes) -> Raw:
    """Wrap JSON text as ``Raw`` after checking it is exactly one JSON value,
    at most ``MAX_DEPTH`` deep; raises ``BadJSON`` otherwise.

    Raw values are spliced into frames verbatim, so text from a worker must be
    checked before it can reach the host.
    """
    try:
        _check_utf8(data)
        return _raw_decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        if _outline(data)[1]:
            raise BadJSON(TOO_DEEP) from None
        return Raw(data)
