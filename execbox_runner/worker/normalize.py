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
error with its own message. ``Program.source()`` is the JavaScript source of an
async function expression, which the worker evaluates and calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import tree_sitter
import tree_sitter_javascript

_FENCE = "```"


@lru_cache(maxsize=1)
def _parser() -> tree_sitter.Parser:
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_javascript.language()))


def strip_fence(code: str) -> str:
    """Remove a Markdown code fence that wraps the whole input (any info string).

    The opening fence line must end in a newline; the closing fence must end the
    input. Anything else is returned unchanged.
    """
    text = code.strip()
    if not text.startswith(_FENCE) or not text.endswith(_FENCE):
        return code
    first_newline = text.find("\n")
    if first_newline < 0 or first_newline + 1 > len(text) - len(_FENCE):
        return code
    body = text[first_newline + 1 : -len(_FENCE)]
    return body[:-1] if body.endswith("\n") else body


@dataclass(frozen=True)
class Program:
    """Normalized guest code: the body of an async function, or a lone async arrow to call."""

    body: str | None = None
    arrow: str | None = None

    def source(self) -> str:
        """JavaScript source of the async function expression that runs the program."""
        if self.arrow is not None:
            return self.arrow
        return "async () => {\n" + self.body + "\n}" if self.body else "async () => {}"


def normalize(code: str) -> Program:
    """Normalize guest code as execbox does (see the module docstring)."""
    source = strip_fence(code).strip()
    if not source:
        return Program(body="")
    data = source.encode()
    root = _parser().parse(data).root_node
    if root.has_error:
        return Program(body=source)
    statements = [node for node in root.named_children if node.type != "comment"]
    if not statements:
        return Program(body="")

    def text(node: tree_sitter.Node) -> str:
        return data[node.start_byte : node.end_byte].decode()

    last = statements[-1]
    if len(statements) == 1:
        if last.type in {"function_declaration", "generator_function_declaration"}:
            name = last.child_by_field_name("name")
            if name is not None:
                return Program(body=source + "\nreturn " + text(name) + "();")
        expression = _expression(last)
        if expression is not None and expression.type == "arrow_function" and _is_async(expression):
            return Program(arrow=text(expression))
    expression = _expression(last)
    if expression is None:
        return Program(body=source)
    prefix = data[: last.start_byte].decode().rstrip()
    return Program(body=(prefix + "\n" if prefix else "") + "return (" + text(expression) + ");")


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
