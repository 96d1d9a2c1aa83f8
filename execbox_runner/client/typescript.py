"""TypeScript declarations rendered from tools' JSON Schemas.

The manifest's ``types`` field is what a model reads before it writes guest
code, so it says what each tool takes and returns in the language the model
writes. The layout follows execbox's own rendering (``declare namespace``, one
``function`` per tool, doc comments from descriptions); where execbox gives up
on a schema form (unions, ``$ref``, enums) this renders it, because Python type
hints produce those forms all the time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias

JsonSchema: TypeAlias = Mapping[str, Any]

_IDENTIFIER: Final = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$]*$")
_PRIMITIVES: Final = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean", "null": "null"}


def declare_namespace(name: str, members: Sequence[str]) -> str:
    """``declare namespace NAME { ... }`` around the members, one blank line apart."""
    if not members:
        return f"declare namespace {name} {{}}"
    body = _indent("\n\n".join(members))
    return f"declare namespace {name} {{\n{body}\n}}"


def declare_function(
    name: str, description: str | None, input_schema: JsonSchema | None, output: JsonSchema | None
) -> str:
    """One tool: ``function name(input: In): Promise<Out>;`` with its description as a doc comment.

    An object input whose properties are all optional becomes ``input?:``, and
    one that allows no properties at all is left out, so the model sees that
    the tool can be called with no argument.
    """
    resolved = None if input_schema is None else _resolve(input_schema, input_schema, frozenset())[0]
    if resolved is not None and _is_empty_object(resolved):
        parameter = ""
    else:
        optional = resolved is not None and _is_object(resolved) and not resolved.get("required")
        parameter = f"input{'?' if optional else ''}: {schema_to_type(input_schema)}"
    comment = _doc_comment(description)
    return f"{comment}function {name}({parameter}): Promise<{schema_to_type(output)}>;"


def schema_to_type(schema: JsonSchema | bool | None, root: JsonSchema | None = None) -> str:
    """A TypeScript type for a JSON Schema (``unknown`` for what it cannot express)."""
    return _type(schema, root if root is not None else (schema if isinstance(schema, Mapping) else {}), frozenset())


def _type(schema: JsonSchema | bool | None, root: JsonSchema, seen: frozenset[str]) -> str:
    if schema is None or schema is True:
        return "unknown"
    if schema is False:
        return "never"
    schema, seen = _resolve(schema, root, seen)
    if schema is None:
        return "unknown"  # a recursive or unresolvable $ref
    if "const" in schema:
        return json.dumps(schema["const"])
    if isinstance(schema.get("enum"), list):
        return _union([json.dumps(value) for value in schema["enum"]])
    for key, joiner in (("anyOf", " | "), ("oneOf", " | "), ("allOf", " & ")):
        if isinstance(schema.get(key), list):
            parts = [_type(part, root, seen) for part in schema[key]]
            return _union(parts) if joiner == " | " else joiner.join(_group(part) for part in dict.fromkeys(parts))
    kinds = schema.get("type")
    if isinstance(kinds, list):
        return _union([_type({**schema, "type": kind}, root, seen) for kind in kinds])
    if kinds in _PRIMITIVES:
        return _PRIMITIVES[kinds]
    if kinds == "array" or (kinds is None and ("items" in schema or "prefixItems" in schema)):
        return _array(schema, root, seen)
    if kinds == "object" or (kinds is None and "properties" in schema):
        return _object(schema, root, seen)
    return "unknown"


def _array(schema: JsonSchema, root: JsonSchema, seen: frozenset[str]) -> str:
    prefix = schema.get("prefixItems")
    if isinstance(prefix, list):
        items = [_type(item, root, seen) for item in prefix]
        if schema.get("items") not in (False, None):
            items.append(f"...{_group(_type(schema['items'], root, seen))}[]")
        return f"[{', '.join(items)}]"
    item = _type(schema.get("items"), root, seen)
    return f"{item}[]" if _IDENTIFIER.match(item) else f"Array<{item}>"


def _object(schema: JsonSchema, root: JsonSchema, seen: frozenset[str]) -> str:
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    if not isinstance(properties, Mapping) or not properties:
        if extra is False:
            return "Record<string, never>"
        return f"Record<string, {_type(extra if isinstance(extra, Mapping) else None, root, seen)}>"
    required = set(schema.get("required") or ())
    lines = []
    for name, prop in properties.items():
        key = name if _IDENTIFIER.match(name) else json.dumps(name)
        description = prop.get("description") if isinstance(prop, Mapping) else None
        optional = "" if name in required else "?"
        lines.append(f"{_doc_comment(description)}{key}{optional}: {_type(prop, root, seen)};")
    return "{\n" + _indent("\n".join(lines)) + "\n}"


def _resolve(schema: JsonSchema, root: JsonSchema, seen: frozenset[str]) -> tuple[JsonSchema | None, frozenset[str]]:
    """Follow local ``$ref``s (``#/$defs/X``, ``#/definitions/X``); ``None`` for a cycle or a dangling one."""
    while isinstance(ref := schema.get("$ref"), str):
        if ref in seen or not ref.startswith("#/"):
            return None, seen
        seen = seen | {ref}
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, Mapping) else None
        if not isinstance(target, Mapping):
            return None, seen
        schema = target
    return schema, seen


def _is_object(schema: JsonSchema) -> bool:
    return schema.get("type") == "object" or (schema.get("type") is None and "properties" in schema)


def _is_empty_object(schema: JsonSchema) -> bool:
    return _is_object(schema) and not schema.get("properties") and schema.get("additionalProperties") is False


def _union(parts: list[str]) -> str:
    unique = list(dict.fromkeys(parts))
    return "unknown" if "unknown" in unique else " | ".join(unique) or "never"


def _group(type_: str) -> str:
    """Parenthesize a union or intersection where it would bind wrongly (``(A | B)[]``)."""
    return f"({type_})" if " | " in type_ or " & " in type_ else type_


def _doc_comment(description: str | None) -> str:
    if not description:
        return ""
    lines = description.replace("*/", "*\\/").splitlines()
    return "/**\n" + "".join(f" * {line}".rstrip() + "\n" for line in lines) + " */\n"


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" if line else line for line in text.split("\n"))
