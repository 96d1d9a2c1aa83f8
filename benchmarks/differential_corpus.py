"""The cases ``differential.py`` runs on both runners: what model-written guest code hits.

Each case: ``name``, guest ``code``, the ``providers`` it may call (provider, tool and what the tool
does: ``returns`` a value, ``echo``es its input or ``throws``; see ``execbox_host/differential.ts``)
and execution ``options`` (``timeoutMs``, ``memoryLimitBytes``, ``maxLogLines``, ``maxLogChars``).
"""

from __future__ import annotations

from typing import Any, Final

Case = dict[str, Any]

ECHO: Final = {"t": {"echo": {"echo": True}}}
TOOLS: Final = {
    "t": {
        "echo": {"echo": True},
        "fails": {"throws": "upstream said no"},
        "fails_coded": {"throws": {"message": "not allowed", "code": "E_DENIED"}},
        "fails_string": {"throws": {"value": "a bare string"}},
        "fails_null": {"throws": {"value": None}},
        "nothing": {},
        "slow": {"delayMs": 300, "returns": "late"},
        "obj": {"returns": {"a": [1, 2, {"b": None}], "s": "x"}},
    }
}


def case(name: str, code: str, providers: dict[str, Any] | None = None, /, **options: int) -> Case:
    """One case; ``options`` are the execution's runtime options."""
    return {"name": name, "code": code, "providers": providers or {}, "options": options}


def results() -> list[Case]:
    """The final result of every kind of JavaScript value."""
    values = {
        "undefined": "undefined",
        "null": "null",
        "number": "42",
        "float": "0.1 + 0.2",
        "NaN": "NaN",
        "negative_zero": "-0",
        "Infinity": "Infinity",
        "minus_Infinity": "-Infinity",
        "bigint": "10n",
        "symbol": "Symbol('s')",
        "function": "(function f() {})",
        "arrow_function_value": "(() => 1)",
        "class_value": "(class A {})",
        "date": "new Date(0)",
        "map": "new Map([[1, 2]])",
        "set": "new Set([1, 2])",
        "regexp": "/ab+c/g",
        "typed_array": "new Uint8Array([1, 2, 3])",
        "array_buffer": "new ArrayBuffer(4)",
        "string": "'hello'",
        "empty_string": "''",
        "boolean": "true",
        "array_holes": "[1, , 3]",
        "array_with_undefined": "[1, undefined, () => 1]",
        "object_with_undefined": "({ a: 1, b: undefined, c: () => 1 })",
        "object_with_nan": "({ a: NaN, b: Infinity })",
        "object_with_bigint": "({ a: 1n })",
        "object_with_symbol_value": "({ a: Symbol('x') })",
        "object_with_symbol_key": "({ [Symbol('k')]: 1, a: 2 })",
        "nested": "({ a: { b: { c: [1, { d: 'e' }] } } })",
        "circular": "const o = { a: 1 }; o.self = o; o",
        "circular_array": "const a = [1]; a.push(a); a",
        "shared_reference": "const x = { v: 1 }; ({ a: x, b: x })",
        "getter": "({ get g() { return 7; }, v: 1 })",
        "throwing_getter": "({ get g() { throw new Error('getter failed'); } })",
        "to_json": "({ toJSON() { return { replaced: true }; } })",
        "class_instance": "class P { constructor() { this.x = 1; } }; new P()",
        "error_value": "new Error('as a value')",
        "promise_value": "Promise.resolve(5)",
        "object_create_null": "const o = Object.create(null); o.a = 1; o",
        "boxed_number": "new Number(3)",
        "large_array": "Array.from({ length: 100000 }, (_, i) => i).length",
        "large_string": "'x'.repeat(1000000).length",
        "large_value": "Array.from({ length: 20000 }, (_, i) => ({ i, s: 'abc' }))",
        "deep_value": "let d = {}; for (let i = 0; i < 5000; i++) d = { d }; d",
        "deep_array": "let d = []; for (let i = 0; i < 5000; i++) d = [d]; d",
        "lone_surrogate": "'a\\uD800b'",
        "surrogate_pair": "'\\uD83D\\uDE00'",
        "unicode_escapes": "'\\u0000\\u001f\\u2028'",
        "large_int": "2 ** 53 + 2",
        "tiny_float": "5e-324",
    }
    return [case(f"result_{name}", code) for name, code in values.items()]


def throws() -> list[Case]:
    """Uncaught thrown values of every kind, and syntax errors."""
    values = {
        "error": "throw new Error('boom')",
        "type_error": "null.x",
        "range_error": "throw new RangeError('out of range')",
        "reference_error": "undefinedVariable + 1",
        "syntax_error_in_eval": "eval('1 +')",
        "custom_subclass": "class MyError extends Error { constructor(m) { super(m); this.name = 'MyError'; } }; throw new MyError('mine')",
        "error_with_code": "const e = new Error('coded'); e.code = 'timeout'; throw e",
        "error_message_timeout": "throw new Error('Execution timed out')",
        "error_message_memory": "throw new Error('out of memory')",
        "string": "throw 'a string'",
        "number": "throw 42",
        "object": "throw { message: 'an object', code: 'tool_error' }",
        "plain_object_no_message": "throw { a: 1 }",
        "null": "throw null",
        "undefined": "throw undefined",
        "error_empty_message": "throw new Error()",
        "error_no_name": "const e = new Error('nameless'); e.name = ''; throw e",
        "aggregate_error": "throw new AggregateError([new Error('a')], 'many')",
        "rejected_promise": "await Promise.reject(new Error('rejected'))",
        "syntax_error": "let x = ;",
        "syntax_error_unterminated": "const s = 'abc",
        "syntax_error_brace": "function f() {",
        "return_outside_function": "return 5",
        "error_with_cause": "throw new Error('outer', { cause: new Error('inner') })",
        "unhandled_rejection": "Promise.reject(new Error('unhandled')); 'finished'",
        "throw_in_then_after_result": "Promise.resolve().then(() => { throw new Error('late') }); 'early'",
        "caught_reference_error": "let r; try { missing } catch (e) { r = [e.name, e instanceof ReferenceError] } r",
        "caught_type_error": "let r; try { null.x } catch (e) { r = [e.name, e.constructor === TypeError] } r",
        "caught_syntax_error_in_eval": "let r; try { eval('1 +') } catch (e) { r = [e.name, e.message] } r",
        "stack_type": "let r; try { null.x } catch (e) { r = typeof e.stack } r",
        "dynamic_import": "await import('fs')",
        "require": "require('fs')",
    }
    return [case(f"throw_{name}", code) for name, code in values.items()]


def normalization() -> list[Case]:
    """How the guest program is read: top-level await, fences, lone expressions, declarations."""
    values = {
        "top_level_await": "const x = await Promise.resolve(3); x * 2",
        "await_expression": "await 7",
        "fenced_js": "```js\n1 + 2\n```",
        "fenced_javascript": "```javascript\nconst a = 2;\na * 3\n```",
        "fenced_plain": "```\n'plain'\n```",
        "lone_object_literal": "{ a: 1 }",
        "lone_expression": "'expr'",
        "function_declaration": "function main() { return 11; }",
        "async_function_declaration": "async function main() { return 12; }",
        "arrow_function": "() => 13",
        "async_arrow_function": "async () => 14",
        "final_expression_after_statements": "const a = 1;\nconst b = 2;\na + b",
        "final_if_statement": "if (true) { 5 } else { 6 }",
        "final_for_loop": "let s = 0; for (let i = 0; i < 3; i++) { s += i }",
        "final_declaration": "const z = 9;",
        "empty": "",
        "whitespace_only": "   \n  ",
        "comment_only": "// nothing",
        "trailing_comment": "1 + 1 // two",
        "semicolon_terminated": "1 + 1;",
        "explicit_return_in_async_iife": "await (async () => { return 15; })()",
        "leading_comment_block": "/* c */ 16",
        "use_strict": "'use strict'; 17",
        "function_then_call": "function f() { return 18; }\nf()",
        "top_level_return": "return await t.echo(19)",
        "fenced_typescript": "```ts\nconst x: number = 1; x\n```",
        "two_fences": "```js\n1\n```\n```js\n2\n```",
        "prose_before_fence": "Here is code:\n```js\n3\n```",
        "export_default": "export default 1",
        "two_function_declarations": "function a() { return 1 } function b() { return 2 }",
        "lone_block": "{ const z = 1; z }",
        "const_arrow_declaration": "const main = async () => { return 1 }",
        "implicit_global": "x = 5\nx",
        "labelled_loop_then_expression": "label: for (;;) break label;\n7",
    }
    return [case(f"code_{name}", code, TOOLS) for name, code in values.items()]


def console() -> list[Case]:
    """console.* formatting of every value kind, and the log limits."""
    values = {
        "strings": "console.log('a', 'b'); console.info('i'); console.warn('w'); console.error('e')",
        "numbers": "console.log(1, -0, NaN, Infinity, 1.5)",
        "undefined_null": "console.log(undefined, null)",
        "no_arguments": "console.log()",
        "bigint": "console.log(10n)",
        "symbol": "console.log(Symbol('s'))",
        "function": "console.log(function f() { return 1; })",
        "object": "console.log({ a: 1, b: [1, 2], c: 'x' })",
        "object_undefined_member": "console.log({ a: undefined, b: 1 })",
        "array": "console.log([1, 'a', null, undefined])",
        "circular": "const o = {}; o.o = o; console.log(o)",
        "error": "console.log(new Error('logged'))",
        "date": "console.log(new Date(0))",
        "map_set": "console.log(new Map([[1, 2]]), new Set([1]))",
        "nested_string": "console.log({ s: 'quoted \"x\"' })",
        "boolean": "console.log(true, false)",
        "lone_surrogate": "console.log('a\\uD800b')",
        "debug_trace": "console.debug('d'); 1",
        "to_json_throwing": "console.log({ toJSON() { throw new Error('no'); } })",
        "max_log_lines": "for (let i = 0; i < 10; i++) console.log('line', i)",
        "max_log_chars": "console.log('x'.repeat(30)); console.log('y'.repeat(30))",
        "default_line_limit": "for (let i = 0; i < 150; i++) console.log(i)",
        "logs_before_throw": "console.log('before'); throw new Error('after')",
        "error_object": "console.log(new TypeError('bad type'))",
        "error_with_code": "const e = new Error('coded'); e.code = 'E_X'; console.log(e)",
        "error_subclass": "class MyError extends Error {}; console.log(new MyError('mine'))",
        "error_nested": "console.log({ e: new Error('nested') })",
        "caught_tool_error": "try { await t.fails({}) } catch (e) { console.log('failed:', e) }",
        "boxed_string": "console.log(new String('boxed'), new Number(2))",
        "promise": "console.log(Promise.resolve(1))",
        "many_arguments": "console.log(1, 'two', [3], { four: 4 }, null, undefined, true)",
        "format_specifiers": "console.log('%s is %d', 'x', 5)",
        "negative_zero": "console.log(-0, [-0], { a: -0 })",
        "binary_values": "console.log(new Uint8Array([1, 2]), new ArrayBuffer(2), /re/g, Object.create(null))",
        "after_result": "Promise.resolve().then(() => console.log('after')); 'r'",
        "unawaited_promise": "console.log(t.echo(1))",
        "newlines": "console.log('a\\nb'); console.log(`multi\nline`)",
    }
    limits = {"max_log_lines": {"maxLogLines": 3}, "max_log_chars": {"maxLogChars": 40}}
    return [case(f"console_{name}", code, TOOLS, **limits.get(name, {})) for name, code in values.items()]


def tools() -> list[Case]:
    """Tool calls: answers, failures, unknown names, non-JSON arguments, concurrency, stragglers."""
    values = {
        "echo": "await t.echo({ a: 1 })",
        "echo_no_input": "await t.echo()",
        "echo_two_arguments": "await t.echo(1, 2)",
        "returns_undefined": "await t.nothing({})",
        "returns_object": "await t.obj({})",
        "throws": "await t.fails({})",
        "throws_coded": "await t.fails_coded({})",
        "throws_string": "await t.fails_string({})",
        "throws_null": "await t.fails_null({})",
        "caught_failure": "try { await t.fails({}) } catch (e) { [e.name, e.message, e.code, e instanceof Error] }",
        "caught_coded_failure": "try { await t.fails_coded({}) } catch (e) { [e.message, e.code] }",
        "caught_then_rethrown": "try { await t.fails({}) } catch (e) { throw e }",
        "caught_then_new_error": "try { await t.fails({}) } catch (e) { throw new Error('wrapped: ' + e.message) }",
        "unknown_tool": "await t.missing({})",
        "unknown_tool_typeof": "typeof t.missing",
        "unknown_provider": "await nope.echo({})",
        "provider_keys": "Object.keys(t).sort()",
        "tool_typeof": "typeof t.echo",
        "bigint_argument": "await t.echo({ n: 1n })",
        "function_argument": "await t.echo({ f: () => 1 })",
        "undefined_member_argument": "await t.echo({ a: undefined, b: 1 })",
        "nan_argument": "await t.echo({ n: NaN })",
        "circular_argument": "const o = {}; o.o = o; await t.echo(o)",
        "date_argument": "await t.echo({ d: new Date(0) })",
        "map_argument": "await t.echo(new Map([[1, 2]]))",
        "string_argument": "await t.echo('s')",
        "promise_all": "await Promise.all([t.echo(1), t.echo(2), t.echo(3)])",
        "promise_all_one_fails": "await Promise.all([t.echo(1), t.fails({})])",
        "promise_allsettled": "(await Promise.allSettled([t.echo(1), t.fails({})])).map(r => r.status)",
        "unawaited_call": "t.echo({ x: 1 }); 'returned'",
        "unawaited_failing_call": "t.fails({}); 'returned'",
        "call_returns_promise": "const p = t.echo(1); p instanceof Promise",
        "call_after_result": "setTimeout(() => t.echo('late'), 0); 'early'",
        "slow_tool": "await t.slow({})",
        "sequential_calls": "let s = 0; for (let i = 0; i < 20; i++) s += await t.echo(i); s",
        "timeout_awaiting_tool": "await t.slow({})",
        "tool_result_mutation": "const r = await t.obj({}); r.a.push(3); r.a.length",
        "undefined_argument": "await t.echo(undefined)",
        "lone_surrogate_argument": "await t.echo('a\\uD800b')",
        "getter_argument": "await t.echo({ get g() { return 1; } })",
        "throwing_getter_argument": "await t.echo({ get g() { throw new Error('getter failed'); } })",
        "class_instance_argument": "class P { constructor() { this.x = 1; } }; await t.echo(new P())",
        "caught_bad_argument": "let r; try { await t.echo({ n: 1n }) } catch (e) { r = [e.name, e.code] } r",
        "promise_race": "await Promise.race([t.slow({}), t.echo('fast')])",
        "then_chain": "await t.echo(2).then(v => v * 3)",
        "caught_failure_stack_type": "let r; try { await t.fails({}) } catch (e) { r = [typeof e.stack, Object.keys(e)] } r",
        "rejects_after_result": "t.fails({}).catch(() => {}); 'done first'",
        "tool_name_property": "t.echo.name",
        "namespace_frozen": "t.extra = 1; typeof t.extra",
        "map_without_promise_all": "[1, 2, 3].map(async x => await t.echo(x))",
        "for_await": "let r = []; for await (const x of [t.echo(1), t.echo(2)]) r.push(x); r",
        "catch_method": "await t.fails({}).catch(e => e.message)",
        "json_parse_failure": "JSON.parse(await t.echo('{bad'))",
    }
    options = {"timeout_awaiting_tool": {"timeoutMs": 100}}
    providers = {"unknown_provider": ECHO}
    return [
        case(f"tool_{name}", code, providers.get(name, TOOLS), **options.get(name, {})) for name, code in values.items()
    ]


def limits() -> list[Case]:
    """Timeouts, the memory limit, loops and recursion."""
    return [
        case("limit_infinite_loop", "while (true) {}", timeoutMs=300),
        case("limit_infinite_loop_after_log", "console.log('spinning'); for (;;) {}", timeoutMs=300),
        case("limit_async_hang", "await new Promise(() => {})", timeoutMs=300),
        case("limit_set_timeout", "await new Promise(r => setTimeout(() => r('fired'), 10))", timeoutMs=1000),
        case("limit_memory", "const a = []; for (;;) a.push('x'.repeat(1024) + a.length)", memoryLimitBytes=16 << 20),
        case("limit_memory_big_array", "new Array(1e9).fill(0).length", memoryLimitBytes=16 << 20),
        case("limit_recursion", "function f(n) { return f(n + 1) + 1; } f(0)"),
        case("limit_recursion_caught", "function f() { f(); } try { f() } catch (e) { e.constructor.name }"),
        case("limit_catch_timeout", "try { while (true) {} } catch (e) { 'caught' }", timeoutMs=300),
        case(
            "limit_finally_after_timeout", "try { while (true) {} } finally { console.log('finally') }", timeoutMs=300
        ),
        case("limit_logs_then_timeout", "console.log('kept'); await new Promise(() => {})", timeoutMs=300),
        case("limit_string_growth", "let s = 'x'; for (;;) s += s", memoryLimitBytes=16 << 20),
        case(
            "limit_caught_memory",
            "let r; try { new Array(1e9).fill(0) } catch (e) { r = e.name } r",
            memoryLimitBytes=16 << 20,
        ),
    ]


def corpus() -> list[Case]:
    """Every case, in order."""
    return [*results(), *throws(), *normalization(), *console(), *tools(), *limits()]
