"""Python callables as guest tools: manifests for the runner, checked calls for the host.

The runner only ever sees names and types; the callables stay here. By
default a tool's input is an object whose properties are the callable's
parameters, typed by its annotations: ``def fetch_page(url: str, limit: int = 10)``
is called from guest code as ``await web.fetch_page({url, limit})``. msgspec
derives the JSON Schema from the annotations and checks the input against the
same types, so what the model reads in ``types`` and what the host enforces
cannot drift apart; hints naming pydantic models, or saying what only pydantic
reads, go to pydantic (``pydantic_types``). A tool given an explicit
``input_schema`` (for example one forwarded from an MCP server) instead
receives the input value as its one argument, checked with ``jsonschema``.
"""

from __future__ import annotations

import copy
import inspect
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import CodeType, ModuleType
from typing import Any, Final, Protocol, TypeAlias, cast

import anyio.to_thread
import jsonschema
import msgspec
from msgspec import UNSET, UnsetType

from ..protocol.messages import ErrorInfo, ProviderManifest, ToolCall, ToolDescriptor, ToolResult
from .approval import ApprovalRequest, Approver, require_approval
from .errors import ToolError
from .typescript import JsonSchema, declare_function, declare_namespace

log = logging.getLogger(__name__)

# The JavaScript reserved words that execbox's sanitizer appends "_" to; the same list keeps safe names identical.
_RESERVED: Final = frozenset({
    "await", "break", "case", "catch", "class", "const", "continue", "debugger", "default", "delete", "do", "else",
    "enum", "export", "extends", "false", "finally", "for", "function", "if", "import", "in", "instanceof", "new",
    "null", "return", "super", "switch", "this", "throw", "true", "try", "typeof", "var", "void", "while", "with",
    "yield",
})  # fmt: skip
_IDENTIFIER: Final = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_NOT_IDENTIFIER_CHARS: Final = re.compile(r"[^A-Za-z0-9_$]+")
_PARAMETER_KINDS: Final = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def _nothing() -> None:
    """No one to tell that a tool began."""


def safe_name(name: str) -> str:
    """The guest-visible identifier for a tool name, as execbox sanitizes it."""
    name = _NOT_IDENTIFIER_CHARS.sub("_", name.strip()).strip("_") or "_"
    if name[0].isdigit():
        name = f"_{name}"
    return f"{name}_" if name in _RESERVED else name


@dataclass(frozen=True)
class Tool:
    """A callable with what the guest (and the model writing guest code) should know about it.

    Plain callables in a provider mapping are wrapped with the defaults; use
    ``Tool`` to give a description other than the docstring, or explicit JSON
    Schemas. With ``input_schema`` the callable receives the whole input as
    one argument (``None`` when the guest passed none); an ``output_schema`` is
    checked against every return value. With ``approve``, each call runs only once that callback
    approves it (``approval``).
    """

    func: Callable[..., Any]
    description: str | None = None
    input_schema: JsonSchema | None = None
    output_schema: JsonSchema | None = None
    approve: Approver | None = None


class BoundTool:
    """One tool of one provider, ready to answer ``tool_call``s."""

    def __init__(self, provider: str, name: str, tool: Tool, approve: Approver | None = None) -> None:
        self.name = f"{provider}.{name}"
        self.provider = provider
        self.original_name = name
        self.approve = tool.approve or approve
        self.func = tool.func
        self.is_async = inspect.iscoroutinefunction(tool.func)
        signature = _signature(name, tool.func)
        self.description = tool.description
        if self.description is None and (inspect.isfunction(tool.func) or inspect.ismethod(tool.func)):
            self.description = inspect.getdoc(tool.func)
        self.output_schema = tool.output_schema or _schema_of(signature.return_annotation)
        self._output_validator = _validator(tool.output_schema, name) if tool.output_schema is not None else None
        self._input_validator: jsonschema.protocols.Validator | None = None
        self._parameters: _Parameters | None = None
        if tool.input_schema is not None:
            self.input_schema: JsonSchema = tool.input_schema
            self._input_validator = _validator(tool.input_schema, name)
        else:
            self._parameters = _parameters(name, signature)
            self.input_schema = self._parameters.schema

    def declaration(self, safe: str) -> str:
        return declare_function(safe, self.description, self.input_schema, self.output_schema)

    async def call(self, raw_input: msgspec.Raw | UnsetType, began: Callable[[], None] = _nothing) -> msgspec.Raw:
        """Check the input, run the tool, check its result; every failure is a ``ToolError``.

        ``began`` is called as the tool's function starts (in its thread, for a plain function), or
        as it waits for approval: from then on, stopping the call cannot keep it from running."""
        args, kwargs = self._arguments(raw_input)
        if self.approve is not None:
            began()  # waiting for a person: nothing of the tool has run, nor runs unless approved
            value = args[0] if args else kwargs
            await require_approval(self.approve, ApprovalRequest(self.provider, self.original_name, value))
        try:
            if self.is_async:
                began()
                value = await self.func(*args, **kwargs)
            else:

                def run() -> Any:
                    began()
                    return self.func(*args, **kwargs)

                value = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
                if inspect.isawaitable(value):  # a plain function that returns a coroutine
                    value = await value
        except ToolError:
            raise
        except Exception as exc:
            log.debug("tool %s raised", self.name, exc_info=True)
            raise ToolError("tool_error", str(exc) or f"Tool {self.original_name} failed") from exc
        return msgspec.Raw(self._encode(value))

    def _arguments(self, raw_input: msgspec.Raw | UnsetType) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments from the guest's input (omitted input: no arguments / ``None``)."""
        if self._parameters is None:
            value = None if raw_input is UNSET else msgspec.json.decode(raw_input)
            assert self._input_validator is not None
            _check(self._input_validator, value, f"Invalid input for tool {self.original_name}")
            return (value,), {}
        try:
            return (), self._parameters.arguments(b"{}" if raw_input is UNSET else raw_input)
        except ValueError as exc:
            raise ToolError("validation_error", f"Invalid input for tool {self.original_name}: {exc}") from None

    def _encode(self, value: Any) -> bytes:
        """JSON for the guest: plain data plus what msgspec converts (Structs, dataclasses, tuples,
        sets, enums, datetimes); NaN, infinities, cycles and other objects are refused."""
        try:
            pydantic = _pydantic()
            data = msgspec.to_builtins(
                value, str_keys=True, enc_hook=None if pydantic is None else pydantic.to_builtins
            )
            text = json.dumps(data, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise ToolError(
                "serialization_error", f"Tool {self.original_name} returned a non-serializable value: {exc}"
            ) from None
        if self._output_validator is not None:
            _check(self._output_validator, data, f"Invalid output for tool {self.original_name}")
        return text.encode()


class _Function(Protocol):
    """Any Python function: what mypy makes of a dict of functions with different signatures
    (``{"a": f, "b": g}`` is ``dict[str, function]``, which no ``Callable`` type accepts)."""

    __code__: CodeType


ToolLike: TypeAlias = Callable[..., Any] | _Function | Tool
ProviderTools: TypeAlias = Mapping[str, Mapping[str, ToolLike]]
"""Tools by namespace, then by name: ``{"namespace": {"tool name": function or Tool}}``. Annotate a
mapping built apart from the call with it when it mixes functions and ``Tool``s."""


class Providers:
    """Resolved providers: manifests and ``types`` for the runner, dispatch of tool calls for the host.

    Build once and reuse across executions; ``types`` is also what to show a
    model so that it writes code against these tools.
    """

    def __init__(self, providers: ProviderTools, *, approve: Approver | None = None) -> None:
        """``approve``: the approval every tool without its own ``approve`` needs (``approval``)."""
        self._tools: dict[str, dict[str, BoundTool]] = {}
        self._manifests: list[ProviderManifest] = []
        self._declarations: list[list[str]] = []  # each provider's, its tools' in the manifest's order
        self._max_calls: int | None = None  # no bound on the number of calls (``limited``)
        self._calls = 0
        for provider, tools in providers.items():
            if not _IDENTIFIER.match(provider) or provider in _RESERVED:
                raise ValueError(f"Invalid provider namespace: {provider!r} (it becomes a guest global)")
            bound: dict[str, BoundTool] = {}
            for name, tool in tools.items():
                base = safe = safe_name(name)
                suffix = 2
                while safe in bound:  # two names that sanitize alike, as execbox numbers them
                    safe, suffix = f"{base}__{suffix}", suffix + 1
                described = (
                    tool if isinstance(tool, Tool) else Tool(cast(Callable[..., Any], tool))
                )  # a _Function is one
                bound[safe] = BoundTool(provider, name, described, approve)
            self._tools[provider] = bound
            descriptors = {
                safe: ToolDescriptor(
                    safeName=safe, originalName=tool.original_name, description=tool.description or UNSET
                )
                for safe, tool in bound.items()
            }
            declarations = [tool.declaration(safe) for safe, tool in bound.items()]
            self._declarations.append(declarations)
            types = declare_namespace(provider, declarations)
            self._manifests.append(ProviderManifest(name=provider, tools=descriptors, types=types))

    @classmethod
    def of(cls, providers: Providers | ProviderTools | None) -> Providers:
        if isinstance(providers, Providers):
            return providers
        return cls(providers or {})

    @property
    def manifests(self) -> list[ProviderManifest]:
        return self._manifests

    def declarations(self) -> Iterator[tuple[str, ToolDescriptor, str]]:
        """Each tool's namespace, descriptor (as the manifest has it) and TypeScript declaration:
        ``types`` one tool at a time, for a prompt that shows a model only some of them."""
        for manifest, declarations in zip(self._manifests, self._declarations, strict=True):
            for descriptor, declaration in zip(manifest.tools.values(), declarations, strict=True):
                yield manifest.name, descriptor, declaration

    def limited(self, max_calls: int) -> Providers:
        """These tools for one execution, which may call them ``max_calls`` times in all: later calls
        (whatever they ask) answer ``tool_error`` and run nothing. The tools stay resolved once."""
        limited = copy.copy(self)
        limited._max_calls, limited._calls = max_calls, 0
        return limited

    @property
    def types(self) -> str:
        """Every provider's TypeScript declarations, for a model's prompt."""
        return "\n\n".join(manifest.types for manifest in self._manifests if isinstance(manifest.types, str))

    async def answer(self, call: ToolCall, began: Callable[[], None] = _nothing) -> ToolResult:
        """The ``tool_result`` for a ``tool_call``: the tool's value, or its failure as a stable code
        (``began`` as for ``BoundTool.call``)."""
        if self._max_calls is not None:
            self._calls += 1
            if self._calls > self._max_calls:
                error = ErrorInfo("tool_error", f"Tool call limit reached ({self._max_calls} per execution)")
                return ToolResult(callId=call.callId, ok=False, error=error)
        tool = self._tools.get(call.providerName, {}).get(call.safeToolName)
        if tool is None:
            error = ErrorInfo("internal_error", f"Unknown tool {call.providerName}.{call.safeToolName}")
            return ToolResult(callId=call.callId, ok=False, error=error)
        try:
            return ToolResult(callId=call.callId, ok=True, result=await tool.call(call.input, began))
        except ToolError as exc:
            return ToolResult(callId=call.callId, ok=False, error=ErrorInfo(exc.code, exc.message))
        except Exception as exc:  # a failure of the host's own checks (say, a schema's unresolvable $ref)
            log.exception("answering a call of %s failed", tool.name)
            error = ErrorInfo("internal_error", f"Tool {tool.original_name} could not be called: {exc}")
            return ToolResult(callId=call.callId, ok=False, error=error)


def _signature(name: str, func: Callable[..., Any]) -> inspect.Signature:
    """``func``'s signature with its type hints evaluated; the errors name the tool and say what to do."""
    try:
        return inspect.signature(func, eval_str=True)
    except (NameError, SyntaxError) as exc:  # string hints (``from __future__ import annotations``) naming no type here
        raise TypeError(
            f"tool {name!r}: cannot resolve its type hints ({exc}); a type they name must be importable from the "
            "function's module (not defined inside a function, nor imported only under TYPE_CHECKING)"
        ) from None
    except (TypeError, ValueError) as exc:  # not callable, or a builtin without a signature
        raise type(exc)(f"tool {name!r}: {exc}; give a Python function") from None


class _Parameters(Protocol):
    """A tool's parameters as the properties of one input object."""

    schema: JsonSchema

    def arguments(self, raw: msgspec.Raw | bytes) -> dict[str, Any]:
        """The keyword arguments for the JSON input ``raw`` (only the properties given, so the
        function's own defaults apply, never shared between calls); ``ValueError`` saying what
        does not fit where."""
        ...


class _StructParameters:
    """Parameters described and checked by msgspec: a Struct with one field per parameter, UNSET
    where the guest leaves one out."""

    def __init__(self, name: str, fields: dict[str, tuple[Any, bool]]) -> None:
        """Raises ``TypeError`` for a hint msgspec cannot express."""
        specs = [
            (field, hint, msgspec.NODEFAULT) if required else (field, hint | UnsetType, UNSET)
            for field, (hint, required) in fields.items()
        ]
        self._struct = msgspec.defstruct(f"{name}_input", specs, kw_only=True, forbid_unknown_fields=True)
        self.schema = _inline(msgspec.json.schema(self._struct))

    def arguments(self, raw: msgspec.Raw | bytes) -> dict[str, Any]:
        try:
            decoded = msgspec.json.decode(raw, type=self._struct)
        except msgspec.ValidationError as exc:
            raise ValueError(str(exc)) from None
        values = {field: getattr(decoded, field) for field in self._struct.__struct_fields__}
        return {field: value for field, value in values.items() if value is not UNSET}


def _parameters(name: str, signature: inspect.Signature) -> _Parameters:
    """``signature``'s parameters, by msgspec, or by pydantic for hints that name its models or say
    what only it reads."""
    fields: dict[str, tuple[Any, bool]] = {}
    for parameter in signature.parameters.values():
        if parameter.kind not in _PARAMETER_KINDS:
            raise TypeError(
                f"tool {name!r}: parameter {parameter.name!r} is {parameter.kind.description}; tools take named "
                "parameters (the properties of the guest's input object), or give Tool(func, input_schema=...)"
            )
        hint = Any if parameter.annotation is inspect.Parameter.empty else parameter.annotation
        fields[parameter.name] = (hint, parameter.default is inspect.Parameter.empty)
    describers: list[Callable[[str, dict[str, tuple[Any, bool]]], _Parameters]] = [_StructParameters]
    if (pydantic := _pydantic()) is not None:
        # First where a hint says what only pydantic reads, which msgspec would ignore; else for what msgspec cannot say.
        first = any(pydantic.concerns(hint) for hint, _ in fields.values())
        describers.insert(0 if first else 1, pydantic.Parameters)
    failure: TypeError | None = None
    for describer in describers:
        try:
            return describer(safe_name(name), fields)
        except TypeError as exc:
            if describer is _StructParameters:  # msgspec's reason is the one to give
                failure = exc
    raise TypeError(
        f"tool {name!r}: {failure}; annotate it with JSON types or pydantic models, or give Tool(..., input_schema=...)"
    ) from None


def _schema_of(annotation: Any) -> JsonSchema | None:
    """The JSON Schema of a return annotation (by pydantic where it concerns pydantic), or ``None``
    (``unknown``) when there is none or neither library can say."""
    if annotation is inspect.Signature.empty:
        return None
    pydantic = _pydantic()
    if pydantic is not None and pydantic.concerns(annotation):
        schema: JsonSchema | None = pydantic.schema_of(annotation)
        return schema
    try:
        return _inline(msgspec.json.schema(annotation))
    except (TypeError, ValueError):
        return None if pydantic is None else pydantic.schema_of(annotation)


def _pydantic() -> ModuleType | None:
    """``pydantic_types`` where the application has imported pydantic 2 (and so may hold its models)."""
    if not hasattr(sys.modules.get("pydantic"), "TypeAdapter"):  # none, or pydantic 1
        return None
    from . import pydantic_types  # noqa: PLC0415 - an optional dependency, loaded only once the application has

    return pydantic_types


def _inline(schema: dict[str, Any]) -> JsonSchema:
    """Replace msgspec's top-level ``$ref`` with the definition it names, so the schema reads directly."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return schema
    defs = dict(schema.get("$defs", {}))
    top = {key: value for key, value in defs.pop(ref.removeprefix("#/$defs/")).items() if key != "title"}
    return {**top, "$defs": defs} if defs else top


def _validator(schema: JsonSchema, name: str) -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(dict(schema))
    except jsonschema.SchemaError as exc:
        raise ValueError(f"tool {name!r}: invalid JSON Schema: {exc.message}") from None
    return cls(schema)


def _check(validator: jsonschema.protocols.Validator, value: Any, prefix: str) -> None:
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        raise ToolError("validation_error", f"{prefix}: {error.message} at {error.json_path}")
