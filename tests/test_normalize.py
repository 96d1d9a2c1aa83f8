"""Code forms: what models write becomes one async function (normalize + the real engine)."""

import pytest

from execbox_runner.worker.normalize import Stopped, normalize, strip_fence

from .guestkit import UNDEFINED, error, run, value


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("1 + 1", 2),
        ("1 + 1;", 2),
        ("const a = 2\nconst b = 3\na * b", 6),
        ("const a = 2; a * 5 // trailing comment", 10),
        ("```js\nconst x = 4\nx * 2\n```", 8),
        ("```\n[1, 2]\n```", [1, 2]),
        ("  ```typescript\n'fenced'\n```  \n", "fenced"),
        ("function main() { return 7 }", 7),
        ("async function main() { return await tools.echo(9) }", 9),
        ("async () => 42", 42),
        ("async () => { const r = await tools.echo('x'); return r + 'y' };", "xy"),
        ("await tools.echo(5)", 5),
        ("const r = await tools.echo({ a: 1 }); r.a", 1),
        ("return 5", 5),
        ("if (true) { 3 }", UNDEFINED),
        ("const a = 1", UNDEFINED),
        ("", UNDEFINED),
        ("   \n  ", UNDEFINED),
        ("// only a comment", UNDEFINED),
        ("{ a: 1 }", UNDEFINED),  # a block with a label, as JavaScript reads it
        ("({ a: 1 })", {"a": 1}),
        ("(() => 1)()", 1),
        ("for await (const x of [tools.echo(1)]) { }\n'done'", "done"),
    ],
)
def test_code_forms(code: str, expected: object) -> None:
    assert value(run(code)) == expected


def test_a_lone_plain_arrow_is_a_value_not_called() -> None:
    assert error(run("() => 1"))[0] == "serialization_error"


def test_syntax_errors_are_runtime_errors_with_the_engine_message_and_position() -> None:
    assert error(run("const = 1")) == ("runtime_error", "variable name expected (line 1, column 7)")


def test_strip_fence_leaves_unfenced_or_partial_code_alone() -> None:
    assert strip_fence("```js\nx\n```") == "x"
    assert strip_fence("x\n```") == "x\n```"
    assert strip_fence("```js x```") == "```js x```"


def test_normalize_output_is_one_async_function_body() -> None:
    assert normalize("").source == "(async () => {\n\n})"
    assert normalize("a; b").source == "(async () => {\na;\nreturn (b);\n})"
    assert normalize("async () => 1;").body == "return (async () => 1)();"
    assert normalize("a; b").standalone == "throw 0; (function () { async function main() {\na;\nreturn (b);\n} })"


@pytest.mark.parametrize(
    ("code", "needle", "expected"),
    [
        ("a; b", "b", (1, 4)),
        ("x = 1\n\n  y.z", "y", (3, 3)),
        ("  ```js\nconst a = 1;\nnull.x\n```", "null", (3, 1)),
        ("async () => {\n  é.😀\n}", "😀", (2, 5)),
        ("function main() {\n  boom()\n}", "boom", (2, 3)),
    ],
)
def test_locate_maps_engine_positions_back_to_the_code_as_sent(code: str, needle: str, expected: tuple) -> None:
    program = normalize(code)
    line_index = program.source[: program.source.rindex(needle)]
    line = line_index.count("\n") + 1
    column = len(line_index[line_index.rfind("\n") + 1 :].encode()) + 1  # QuickJS counts UTF-8 bytes
    assert program.locate(line, column) == expected


def test_locate_gives_nothing_for_positions_in_the_wrapping() -> None:
    program = normalize("a; b")
    assert program.locate(1, 1) is None
    assert program.locate(3, 1) is None
    assert program.locate(99, 1) is None


@pytest.mark.parametrize("character", ["é", "€", "😀"])
def test_code_read_in_pieces_keeps_every_character_and_the_last_expression(character: str) -> None:
    """tree-sitter reads the code a piece at a time, whose ends split characters: it joins them."""
    code = f"const s = '{character * 20_000}'\ns.length"
    assert value(run(code)) == 20_000 * len(character.encode("utf-16-le")) // 2


def test_normalizing_stops_when_told_and_reads_no_further() -> None:
    asked: list[None] = []

    def stop() -> bool:
        asked.append(None)
        return len(asked) == 3

    with pytest.raises(Stopped):
        normalize("1;\n" * 100_000 + "2", stop=stop)
    assert len(asked) == 3
    assert normalize("1;\n" * 100_000 + "2", stop=lambda: False).body.endswith("return (2);")
