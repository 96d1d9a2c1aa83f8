"""pydantic models in a tool's type hints, described and checked by pydantic itself.

msgspec describes and checks every hint it knows (``tools``); a hint that names a pydantic model
(``user: User``, ``list[User]``, ``-> User``) or says what only pydantic reads (``Annotated[int,
Field(ge=0)]``, a pydantic dataclass's validators, which msgspec would ignore) is left to pydantic,
so tools written for pydantic-based frameworks work as they are. pydantic is an optional
dependency, which this module imports: a hint can only name one of its models once the
application has imported it, so ``tools`` imports this module only then (``tools._pydantic``) and
a process without pydantic pays nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final, NotRequired, Required, get_args, get_type_hints, is_typeddict

import msgspec
import pydantic
import pydantic.dataclasses
from typing_extensions import TypedDict

_TYPED_DICT: Any = TypedDict  # made at run time (pydantic reads typing's own only from Python 3.12)
# The packages whose ``Annotated`` metadata pydantic reads and msgspec ignores (msgspec reads its own ``Meta``).
_READ: Final = frozenset({"pydantic", "annotated_types"})


class Parameters:
    """A tool's parameters as one pydantic-checked object: its JSON Schema, and the keyword arguments
    for each input (only the properties the guest gave, so the function's own defaults apply)."""

    def __init__(self, name: str, fields: dict[str, tuple[Any, bool]]) -> None:
        """``fields``: each parameter's hint and whether it is required. Raises ``TypeError`` when
        pydantic cannot describe them either."""
        hints = {field: (Required if required else NotRequired)[hint] for field, (hint, required) in fields.items()}
        shape = _TYPED_DICT(f"{name}_input", hints)
        shape.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")
        try:
            self._adapter: pydantic.TypeAdapter[dict[str, Any]] = pydantic.TypeAdapter(shape)
            self.schema: dict[str, Any] = self._adapter.json_schema()
        except pydantic.PydanticUserError as exc:  # PydanticSchemaGenerationError among them
            raise TypeError(str(exc).split("\n", 1)[0]) from None
        self.schema.pop("title", None)

    def arguments(self, raw: msgspec.Raw | bytes) -> dict[str, Any]:
        """The keyword arguments for the JSON input ``raw``; ``ValueError`` saying what is wrong
        where (the first of pydantic's errors, its path as ``$.a.b``) for input that does not fit."""
        try:
            arguments: dict[str, Any] = self._adapter.validate_json(bytes(raw))
        except pydantic.ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            path = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"])
            raise ValueError(f"{error['msg']} - at `${path}`" if path else error["msg"]) from None
        return arguments


def schema_of(hint: Any) -> dict[str, Any] | None:
    """The JSON Schema of a return hint as pydantic serializes it, or None where it cannot say."""
    try:
        schema: dict[str, Any] = pydantic.TypeAdapter(hint).json_schema(mode="serialization")
    except (pydantic.PydanticUserError, TypeError, ValueError):
        return None
    schema.pop("title", None)
    return schema


def to_builtins(value: Any) -> Any:
    """A pydantic model's JSON value, as ``msgspec.to_builtins``'s ``enc_hook``; for anything else
    the ``TypeError`` msgspec raises for a type it does not know."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


def concerns(hint: Any) -> bool:
    """Whether ``hint`` says anything only pydantic reads: it names a model or a pydantic dataclass,
    or has ``Annotated`` metadata of pydantic's or annotated-types' (a ``Field``, ``PositiveInt``'s
    bound, a validator), here or in the fields of the dataclasses, TypedDicts and Structs it names."""
    seen: set[int] = set()

    def reads(hint: Any) -> bool:
        if id(hint) in seen:
            return False
        seen.add(id(hint))
        if isinstance(hint, type) and (
            issubclass(hint, pydantic.BaseModel) or pydantic.dataclasses.is_pydantic_dataclass(hint)
        ):
            return True
        if any(type(meta).__module__.partition(".")[0] in _READ for meta in getattr(hint, "__metadata__", ())):
            return True
        inner = list(get_args(hint))
        if isinstance(hint, type) and (
            dataclasses.is_dataclass(hint) or is_typeddict(hint) or issubclass(hint, msgspec.Struct)
        ):
            try:
                inner += get_type_hints(hint, include_extras=True).values()
            except (NameError, TypeError):  # unresolvable: msgspec says so
                pass
        return any(reads(part) for part in inner)

    return reads(hint)
