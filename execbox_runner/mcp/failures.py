"""How a failure inside the MCP SDK is put in words for the user: the SDK's task groups wrap every
error in exception groups, whose own message says nothing ("unhandled errors in a TaskGroup")."""

from __future__ import annotations


def innermost(exc: BaseException) -> BaseException:
    """The first error inside ``exc``'s exception groups (``exc`` itself when it is none)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def described(exc: BaseException) -> str:
    """What went wrong, in words: the innermost error's message, or its type when it has none."""
    inner = innermost(exc)
    return str(inner) or type(inner).__name__
