"""Guest code that closes the function it runs in: a syntax error, and none of it runs.

Each escape, run before the fix, ran at evaluation outside the guest function, so
its throw was taken for the engine's own (here a forged ``timeout``) or it
replaced the guest function with its own.
"""

import pytest

from execbox_runner.worker.guest import GuestRun
from execbox_runner.worker.normalize import normalize

from .guestkit import error, run, value

FORGE = "(() => { throw 'InternalError: interrupted' })()"

ESCAPES = {
    "close and reopen": f"}}), {FORGE}, (async () => {{",
    "after a statement, on its own lines": f"const a = 1\n}}), {FORGE}, (async () => {{\nreturn a",
    "behind a block comment": f"/* {{ */ }}), {FORGE}, (async () => {{ // }}",
    "behind a template literal": f"`${{'}}'}}` }}), {FORGE}, (async () => {{",
    "behind a regular expression": f"/}}/; }}), {FORGE}, (async () => {{",
    "as a lone async arrow": f"async () => {{ }}), {FORGE}, (async () => {{",
    "after a function declaration": f"function main() {{ }} }}), {FORGE}, (async () => {{ function g() {{",
    "replacing the guest function": "}), (async () => 'escaped'), (async () => {",
    "a statement after the block": "} throw 'InternalError: interrupted'; async function g() {",
    "inside a Markdown fence": f"```js\n}}), {FORGE}, (async () => {{\n```",
}


@pytest.mark.parametrize("escape", ESCAPES)
def test_code_that_closes_the_guest_function_is_a_syntax_error_and_never_runs(escape: str) -> None:
    code, message = error(run(ESCAPES[escape]))
    assert code == "runtime_error"
    assert "nexpected token" in message or "expecting" in message  # QuickJS's syntax errors


def test_a_syntax_error_found_in_the_standalone_body_has_its_position() -> None:
    assert error(run("1\n} throw 0; {")) == ("runtime_error", "Unexpected token 'throw' (line 2, column 3)")


def test_braces_in_strings_comments_templates_and_regular_expressions_are_fine() -> None:
    code = "const s = '})'; /* }) */ // })\nconst t = `${'}'}${s}`; const r = /\\}\\)/.test(s);\n[s, t, r]"
    assert value(run(code)) == ["})", "}})", True]


def test_the_standalone_body_throws_before_anything_in_it_runs() -> None:
    program = normalize("a; b")
    assert program.standalone.startswith("throw 0;")
    assert program.standalone.count(program.body) == program.source.count(program.body) == 1
    assert value(run("[typeof main, Object.keys(globalThis).includes('main')]")) == ["undefined", False]


def test_a_body_without_a_closing_brace_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """It cannot close a block, so it skips the standalone parse, which only reports its syntax error."""
    parsed: list[str] = []
    parse_alone = GuestRun._parse_alone

    def counted(guest: GuestRun) -> None:
        parsed.append(guest.program.body)
        parse_alone(guest)

    monkeypatch.setattr(GuestRun, "_parse_alone", counted)
    assert value(run("6 * 7")) == 42
    assert parsed == []
    assert value(run("({ a: 6 * 7 }).a")) == 42
    assert parsed == ["return (({ a: 6 * 7 }).a);"]
    parsed.clear()
    assert error(run("a b")) == ("runtime_error", "expecting ';' (line 1, column 3)")
    assert parsed == ["a b"]
