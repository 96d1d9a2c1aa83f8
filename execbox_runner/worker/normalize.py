"""Guest code normalization: turn what models write into one async function.

Hosts send code the way models write it, so this matches execbox's own
normalization (acorn-based in TypeScript), using a real JavaScript parser
(tree-sitter) to find statements:

* a Markdown fence around the whole input is stripped, then whitespace;
* empty code yields ``undefined``;
* a lone named function declaration is called (no arguments) and its value returned;
* a lone async arrow function is called (no arguments);
* any other lone expression is returned as it is (a bare function is then not
  serializable, as in execbox);
* otherwise the value of a final expression statement is returned;
* top-level ``await`` works everywhere, because the body runs in an async function.

Code that does not parse is wrapped unchanged, so the engine reports the syntax
error with its own message. So is code that the caller's ``compiles`` refuses
before tree-sitter sees it: the worker lets the engine judge long code first,
so that code nested too deeply to parse fails at once instead of costing
tree-sitter seconds. ``Program.body`` is the body of an async function;
``Program.source`` wraps it in an async function expression, which the worker
evaluates and calls. The program remembers where each copied stretch of the
body came from, so that ``Program.locate`` turns an engine position back into a
line and column of the code as the host sent it.

tree-sitter holds the GIL while it parses, seconds for megabytes of code, and every other
execution of the worker would wait that long: it reads the code in pieces (``CHUNK_BYTES``), each
a moment in which the worker's other threads run, and ``normalize`` stops reading when its
``stop`` says so (the execution's deadline, a cancel), raising ``Stopped``.

Guest braces must not change the structure around the body: a body that closes
the wrapper's block (``}), evil(), (async () => {``) would run at evaluation,
outside the function, with its throws taken for the engine's. So the worker
first evaluates ``Program.standalone``, the same body in a function declaration
behind a ``throw`` that runs first (nothing in it ever runs). Both are async
functions in sloppy scripts, so QuickJS reads the body's tokens alike in each.
After a block that closes the arrow function of ``source``, QuickJS accepts
only ``,`` or ``)``; after one that closes the declaration, a statement, which
never starts with either. So a body that closes ``source``'s function is a
syntax error in ``standalone``, and one that parses in both is one function
body, as QuickJS itself reads it (``tests/test_escape.py``). A body without a
``}`` closes no block, so the worker evaluates ``source`` at once, and parses
``standalone`` only to report the body's syntax error.
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

import tree_sitter
import tree_sitter_javascript

_FENCE = "```"
# Both wrappers take the body from line 2, column 1, so positions in either locate alike.
_OPEN = "(async () => {\n"
_CLOSE = "\n})"
_STANDALONE_OPEN = "throw 0; (function () { async function main() {\n"
_STANDALONE_CLOSE = "\n} })"
_OPENING = frozenset({"{", "(", "[", "${"})
_CLOSING = frozenset({"}", ")", "]"})


# How much of the code tree-sitter reads at a time: a few milliseconds of parsing at most.
CHUNK_BYTES: Final = 16 << 10


class Stopped(Exception):
    """``normalize``'s ``stop`` said so before tree-sitter had read all the code."""


@lru_cache(maxsize=1)
def _language() -> tree_sitter.Language:
    return tree_sitter.Language(tree_sitter_javascript.language())


_threads: Final = threading.local()


def _parser() -> tree_sitter.Parser:
    """This thread's parser: a parse lets other threads run between the pieces it reads, and a
    parser is not safe to use in two at once (the worker crashed)."""
    parser: tree_sitter.Parser | None = getattr(_threads, "parser", None)
    if parser is None:
        parser = _threads.parser = tree_sitter.Parser(_language())
    return parser


def _parse(data: bytes, stop: Callable[[], bool] | None = None) -> tree_sitter.Tree:
    """``data`` parsed, read a piece at a time (see the module docstring; tree-sitter joins the
    characters the pieces split); ``Stopped`` once ``stop`` says so. Code of one piece, as most
    is, is parsed at once: it would be read whole all the same, and a reader costs each parse."""
    if len(data) <= CHUNK_BYTES:
        return _parser().parse(data)
    stopped = False

    def read(byte: int, _point: tuple[int, int]) -> bytes:
        nonlocal stopped
        if stop is not None and stop():
            stopped = True
            return b""
        return data[byte : byte + CHUNK_BYTES]

    tree = _parser().parse(read)
    if stopped:
        raise Stopped
    return tree


def strip_fence(code: str) -> str:
    """Remove a Markdown code fence that wraps the whole input (any info string).

    The opening fence line must end in a newline; the closing fence must end the
    input. Anything else is returned unchanged.
    """
    start, end = _fence_body(code)
    return code[start:end]


def _fence_body(code: str) -> tuple[int, int]:
    """Where ``strip_fence``'s answer lies in ``code``."""
    text = code.strip()
    lead = len(code) - len(code.lstrip())
    if not text.startswith(_FENCE) or not text.endswith(_FENCE):
        return 0, len(code)
    first_newline = text.find("\n")
    if first_newline < 0 or first_newline + 1 > len(text) - len(_FENCE):
        return 0, len(code)
    start, end = lead + first_newline + 1, lead + len(text) - len(_FENCE)
    return start, end - 1 if code[start:end].endswith("\n") else end


@dataclass(frozen=True)
class Program:
    """Normalized guest code: an async function body, and the origin of its text.

    ``pieces`` are the stretches copied from the host's code, as (offset in
    ``body``, offset in the code, length), in order; the rest is ours.
    """

    body: str
    code: str
    pieces: tuple[tuple[int, int, int], ...] = ()

    @property
    def source(self) -> str:
        """An async function expression with the body, to evaluate and call."""
        return _OPEN + self.body + _CLOSE

    @property
    def standalone(self) -> str:
        """The body alone in a function declaration: it parses iff the body is one function body.

        Evaluating it runs nothing: its first statement throws 0.
        """
        return standalone(self.body)

    def locate(self, line: int, column: int) -> tuple[int, int] | None:
        """The host's (line, column) for QuickJS's position in ``source`` or ``standalone``, both from 1.

        QuickJS counts columns in UTF-8 bytes; the answer counts characters.
        None when the position falls in the wrapping, not in the host's text.
        """
        lines = self.body.split("\n")
        if not 2 <= line <= len(lines) + 1:
            return None
        in_line = lines[line - 2].encode()[: max(column - 1, 0)].decode(errors="ignore")
        return self._origin(sum(len(text) + 1 for text in lines[: line - 2]) + len(in_line))

    def past_body(self, line: int) -> bool:
        """Whether QuickJS's ``line`` in ``source`` or ``standalone`` is in the wrapping after the body."""
        return line > self.body.count("\n") + 2

    def unbalanced(self) -> tuple[str, tuple[int, int] | None] | None:
        """The body's first bracket that pairs with none, for a syntax error QuickJS finds only in the
        wrapping after the body, naming the wrapping's token: a closing bracket with no opening one
        ("Unexpected token '}'"), else the innermost one never closed. Its message, and its
        (line, column) in the host's code; None if every bracket pairs."""
        data = self.body.encode()

        def origin(leaf: tree_sitter.Node) -> tuple[int, int] | None:
            return self._origin(len(data[: leaf.start_byte].decode()))

        opened: list[tree_sitter.Node] = []
        for leaf in _leaves(_parse(data)):
            if leaf.type in _OPENING:
                opened.append(leaf)
            elif leaf.type in _CLOSING:
                if not opened:
                    return f"Unexpected token '{leaf.type}'", origin(leaf)
                opened.pop()
        if not opened:
            return None
        return f"unexpected end of input: '{opened[-1].type}' is never closed", origin(opened[-1])

    def _origin(self, offset: int) -> tuple[int, int] | None:
        """The host's (line, column) of the character at ``offset`` in the body; None if it is ours."""
        index = bisect_right([piece[0] for piece in self.pieces], offset) - 1
        if index < 0:
            return None
        at, origin, length = self.pieces[index]
        if offset - at > length:
            return None
        original = origin + offset - at
        line_start = self.code.rfind("\n", 0, original) + 1
        return self.code.count("\n", 0, original) + 1, original - line_start + 1


class _Builder:
    """A body assembled from our own text and stretches of the host's code."""

    def __init__(self, code: str) -> None:
        self.code = code
        self.parts: list[str] = []
        self.pieces: list[tuple[int, int, int]] = []
        self.length = 0

    def add(self, text: str, origin: int | None = None) -> _Builder:
        if origin is not None and text:
            self.pieces.append((self.length, origin, len(text)))
        self.parts.append(text)
        self.length += len(text)
        return self

    def program(self) -> Program:
        return Program("".join(self.parts), self.code, tuple(self.pieces))


def standalone(body: str) -> str:
    """``body`` in ``Program.standalone``'s wrapping."""
    return _STANDALONE_OPEN + body + _STANDALONE_CLOSE


def normalize(
    code: str, compiles: Callable[[str], bool] | None = None, stop: Callable[[], bool] | None = None
) -> Program:
    """Normalize guest code as execbox does (see the module docstring); ``compiles`` (given the code
    without its fence and outer whitespace) says first whether the engine takes it as a function body.
    ``Stopped`` once ``stop`` says so, asked as each piece of the code is parsed."""
    start, end = _fence_body(code)
    source = code[start:end]
    start += len(source) - len(source.lstrip())
    source = source.strip()
    body = _Builder(code)
    if not source:
        return body.program()
    if compiles is not None and not compiles(source):
        return body.add(source, start).program()
    data = source.encode()
    root = _parse(data, stop).root_node
    statements = _last_statements(root)
    if root.has_error or not statements:
        return body.add(source, start).program()

    def at(byte: int) -> int:
        """Offset in ``code`` of a byte offset in ``data``."""
        return start + len(data[:byte].decode())

    def text(node: tree_sitter.Node) -> str:
        return data[node.start_byte : node.end_byte].decode()

    last = statements[-1]
    if len(statements) == 1:
        if last.type in {"function_declaration", "generator_function_declaration"}:
            name = last.child_by_field_name("name")
            if name is not None:
                return body.add(source, start).add("\nreturn " + text(name) + "();").program()
        expression = _expression(last)
        if expression is not None and expression.type == "arrow_function" and _is_async(expression):
            return body.add("return (").add(text(expression), at(expression.start_byte)).add(")();").program()
    expression = _expression(last)
    if expression is None:
        return body.add(source, start).program()
    prefix = data[: last.start_byte].decode().rstrip()
    if prefix:
        body.add(prefix, start).add("\n")
    return body.add("return (").add(text(expression), at(expression.start_byte)).add(");").program()


def _last_statements(root: tree_sitter.Node) -> list[tree_sitter.Node]:
    """The program's last two statements (comments are none), in order: all that ``normalize`` looks
    at, where a list of all of them cost a Python object for each of a large program's."""
    last: list[tree_sitter.Node] = []
    index = root.named_child_count
    while index > 0 and len(last) < 2:
        index -= 1
        node = root.named_child(index)
        if node is not None and node.type != "comment":
            last.insert(0, node)
    return last


def _leaves(tree: tree_sitter.Tree) -> Iterator[tree_sitter.Node]:
    """The tokens of ``tree`` in order, without those tree-sitter supposed missing; brackets in
    strings, comments and regular expressions are no tokens of their own."""
    cursor = tree.walk()
    while True:
        if cursor.goto_first_child():
            continue
        leaf = cursor.node
        if leaf is not None and not leaf.is_missing:
            yield leaf
        while not cursor.goto_next_sibling():
            if not cursor.goto_parent():
                return


def _expression(statement: tree_sitter.Node) -> tree_sitter.Node | None:
    """The expression of an expression statement, as JavaScript itself reads it.

    tree-sitter accepts a statement starting with ``{`` as an object literal;
    JavaScript reads it as a block, so such a statement yields no value here.
    """
    if statement.type != "expression_statement":
        return None
    children = [child for child in statement.named_children if child.type != "comment"]
    if len(children) != 1 or children[0].type == "object":
        return None
    return children[0]


def _is_async(node: tree_sitter.Node) -> bool:
    return any(child.type == "async" for child in node.children)
