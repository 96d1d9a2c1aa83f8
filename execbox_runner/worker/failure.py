"""How a failed guest execution is reported: which code, and what message.

``memory_limit`` rests only on evidence guest code cannot produce: an
allocation that the runtime's ``memory_limit.MemoryLimit`` refused while the failing
code ran, that is since the guest last resumed (its start, or a tool result).
The failure values QuickJS leaves after an out-of-memory (an InternalError,
``null``, or no value at all) prove nothing by themselves: guest code can throw
``null``, forge an InternalError from a caught one, or keep a real one and throw
it later. The one exception is QuickJS's string-length limit: a string of 2^30
code units cannot fit in any smaller memory limit, so the engine refusing one
(an error no JavaScript code constructed, see bootstrap.js) is an out-of-memory
too, although no allocation was attempted (QuickJS concatenates into ropes).

Errors the engine raised itself (a syntax error, ``null.x``) say where, as
"message (line L, column C)" in the code as the host sent it; a guest's own
error keeps its message exactly as thrown.
"""

from __future__ import annotations

import re
from typing import Final

from ..protocol.messages import ErrorCode
from .normalize import Program

MEMORY_MESSAGE: Final = "Memory limit exceeded"
# An execution ended to keep the daemon within its memory budget (the largest heap goes first).
BUDGET_MESSAGE: Final = "Memory limit exceeded: the runner's memory budget is spent"
STACK_OVERFLOW: Final = "Maximum call stack size exceeded"  # its position is only the deepest call
# The smallest memory a string over QuickJS's maximum length (2^30 - 1 code units) needs.
LONGEST_STRING_BYTES: Final = 1 << 30
# A frame of guest code in a stack trace ("at f (<input>:3:5)"); a frame without a
# function ("at <input>:1:2") is the position in a parsed text, such as JSON.parse's.
_GUEST_FRAME: Final = re.compile(r"\(<input>:(\d+):(\d+)\)")
# The position of an exception that escaped an engine call, syntax errors included.
_ANY_FRAME: Final = re.compile(r"<input>:(\d+):(\d+)")
_ESCAPED_OUT_OF_MEMORY: Final = frozenset({"InternalError: out of memory", "null", "[uninitialized]"})


def guest_failure(
    message: str,
    engine_stack: str | None,
    program: Program,
    *,
    refused: bool | None,
    memory_limit: int,
    resumed: bool,
) -> tuple[ErrorCode, str]:
    """A failure the guest did not catch.

    ``engine_stack`` is the stack of an error the engine raised ("" when it has
    none), None for any other thrown value. ``refused`` says whether an
    allocation was refused while the failing code ran, None where refusals are
    not counted (then QuickJS's own out-of-memory error is the best evidence left).
    ``resumed`` says whether a tool result has resumed the guest: nothing dates
    a "string too long" (ropes reach it refusing nothing), so after that it may
    be one the guest caught and kept, and is no evidence.
    """
    engine = engine_stack is not None
    exhausted = refused if refused is not None else engine and message == "out of memory"
    too_long = engine and message == "string too long" and memory_limit < LONGEST_STRING_BYTES and not resumed
    if exhausted or too_long:
        return "memory_limit", MEMORY_MESSAGE
    if engine_stack is None or message == STACK_OVERFLOW:
        return "runtime_error", message
    return "runtime_error", message + _where(program, _GUEST_FRAME.search(engine_stack))


def out_of_memory(text: str, *, refused: bool | None) -> bool:
    """Whether the exception ``text`` that escaped an engine call is the memory limit's: an allocation
    was ``refused`` (None: refusals are not counted, so its text says)."""
    return bool(refused) or (refused is None and text.partition("\n")[0] in _ESCAPED_OUT_OF_MEMORY)


def escaped_failure(text: str, program: Program, *, refused: bool | None) -> tuple[ErrorCode, str]:
    """An exception that escaped an engine call: raised by the engine, never a guest's value.

    Guest throws become promise rejections inside the bootstrap; what escapes is
    an out-of-memory the bootstrap could not even handle, a stack overflow, or a
    syntax error in the guest's code.
    """
    first_line, _, rest = text.partition("\n")
    if out_of_memory(text, refused=refused):
        return "memory_limit", MEMORY_MESSAGE
    message = first_line.split(": ", 1)[1] if ": " in first_line else first_line
    if message == STACK_OVERFLOW:
        return "runtime_error", message
    frame = _ANY_FRAME.search(rest)
    if first_line.startswith("SyntaxError") and frame and program.past_body(int(frame[1])):
        # Found only in our wrapping: the body's brackets do not pair up, and the token named is ours.
        unpaired = program.unbalanced()
        if unpaired is not None:
            return "runtime_error", unpaired[0] + _at(unpaired[1])
    return "runtime_error", message + _where(program, frame)


def _where(program: Program, frame: re.Match[str] | None) -> str:
    return _at(program.locate(int(frame[1]), int(frame[2])) if frame else None)


def _at(position: tuple[int, int] | None) -> str:
    return f" (line {position[0]}, column {position[1]})" if position else ""
