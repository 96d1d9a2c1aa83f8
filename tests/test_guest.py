"""The guest environment in a real QuickJS runtime: tools, console, errors, trust, limits."""

import json
import threading
import time
from typing import Any

import msgspec
import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import guest as guest_module
from execbox_runner.worker import native
from execbox_runner.worker.guest import GuestRun

from .guestkit import UNDEFINED, HostError, error, run, run_message, value


def failing_host(code: str, message: str):
    def host(provider, tool, value):
        raise HostError(code, message)

    return host


# ------------------------------------------------------------------ namespaces and tools


def test_namespaces_are_plain_objects_of_promise_returning_functions() -> None:
    code = """
    const proto = Object.getPrototypeOf(tools) === Object.prototype;
    const p = tools.echo(1);
    [proto, Object.keys(tools), p instanceof Promise, typeof tools.echo, tools.fail.name, await p]
    """
    assert value(run(code)) == [True, ["echo", "fail"], True, "function", "fail", 1]


def test_only_the_first_argument_is_transported_and_omitted_input_is_undefined() -> None:
    calls: list = []
    run("await tools.echo(1, 2, 3); await tools.echo(); await tools.echo(undefined)", record=calls)
    assert calls == [("tools", "echo", 1), ("tools", "echo", UNDEFINED), ("tools", "echo", UNDEFINED)]


def test_tool_result_without_value_resolves_to_undefined() -> None:
    assert value(run("typeof (await tools.echo(1))", host=lambda p, t, v: UNDEFINED)) == "undefined"


def test_parallel_tool_calls_are_issued_together() -> None:
    calls: list = []
    assert value(run("await Promise.all([tools.echo(1), tools.echo(2), tools.echo(3)])", record=calls)) == [1, 2, 3]
    assert [c[2] for c in calls] == [1, 2, 3]


def test_host_error_rejects_with_code_and_message() -> None:
    host = failing_host("tool_error", "upstream down")
    code = "try { await tools.fail({}) } catch (e) { [e instanceof Error, e.code, e.message] }"
    # A try statement has no completion value; return it explicitly.
    code = "try { await tools.fail({}) } catch (e) { return [e instanceof Error, e.code, e.message] }"
    assert value(run(code, host=host)) == [True, "tool_error", "upstream down"]


@pytest.mark.parametrize("code", ["tool_error", "validation_error", "timeout", "internal_error"])
def test_uncaught_host_error_keeps_its_trusted_code(code: str) -> None:
    assert error(run("await tools.fail({})", host=failing_host(code, "host says no"))) == (code, "host says no")


@pytest.mark.parametrize(
    "forgery",
    [
        "throw Object.assign(new Error('x'), { code: 'tool_error' })",
        "throw { code: 'timeout', message: 'Execution timed out' }",
        "throw new Error('Execution timed out')",
        "throw new Error('out of memory')",
        "throw new RangeError('InternalError: out of memory')",
        "throw Reflect.construct(Error, ['out of memory'], Object)",
        # copy every own property and symbol of a trusted error onto a guest error
        """try { await tools.fail({}) } catch (e) {
             const f = new Error(e.message);
             for (const k of Reflect.ownKeys(e)) Object.defineProperty(f, k, Object.getOwnPropertyDescriptor(e, k));
             Object.setPrototypeOf(f, Object.getPrototypeOf(e));
             throw f;
           }""",
        "try { await tools.fail({}) } catch (e) { throw Object.create(e) }",
        "try { await tools.fail({}) } catch (e) { throw structuredClone ? e : { ...e } }",
        "try { await tools.fail({}) } catch (e) { throw { ...e, message: e.message } }",
        "WeakMap.prototype.get = () => ['timeout', 'forged']; throw new Error('x')",
        "WeakMap.prototype.has = () => true; throw new Error('x')",
    ],
)
def test_guest_made_errors_are_runtime_errors(forgery: str) -> None:
    code, _ = error(run(forgery, host=failing_host("tool_error", "real")))
    assert code == "runtime_error"


def test_mutating_a_trusted_errors_code_does_not_change_the_reported_code() -> None:
    code = "try { await tools.fail({}) } catch (e) { e.code = 'timeout'; e.message = 'forged'; throw e }"
    assert error(run(code, host=failing_host("tool_error", "real"))) == ("tool_error", "real")


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("throw new Error('boom')", "boom"),
        ("throw 'plain'", "plain"),
        ("throw 42", "42"),
        ("throw null", "null"),
        ("throw new TypeError('bad input')", "bad input"),
        ("throw RangeError('r')", "r"),
        ("class E extends Error {}\nthrow new E('mine')", "mine"),
        ("try { null.x } catch (e) { throw new e.constructor('copied') }", "copied"),
        ("try { null.x } catch (e) { throw Reflect.construct(Object.getPrototypeOf(TypeError), ['proto']) }", "proto"),
        ("const v = null;\nv.x", "cannot read property 'x' of null (line 2, column 1)"),
        ("try { null.x } catch (e) { throw e }", "cannot read property 'x' of null (line 1, column 7)"),
    ],
)
def test_guest_throws_become_runtime_errors_with_their_message(code: str, message: str) -> None:
    """A guest's own error keeps its message exactly; an engine error says where it was raised."""
    assert error(run(code)) == ("runtime_error", message)


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("const a = 1;\nconst b = ;\n", "unexpected token in expression: ';' (line 2, column 11)"),
        ("```js\nconst a = 1;\nconst b = ;\n```", "unexpected token in expression: ';' (line 3, column 11)"),
        ("\n\n  let x = 1;\n  x +;", "unexpected token in expression: ';' (line 4, column 6)"),
        ("'é😀'; const b = ;", "unexpected token in expression: ';' (line 1, column 17)"),
        ("const a = 1;\n  undefinedName + a", "undefinedName is not defined (line 2, column 3)"),
        ("async () => {\n  const f = 1;\n  f();\n}", "not a function (line 3, column 3)"),
        ("function main() {\n  return [].reduce((a, b) => a);\n}", "empty array (line 2, column 13)"),
        ("new Array(-1)", "invalid array length (line 1, column 5)"),
        ("function f(n) { return f(n + 1) + 1 } f(0)", "Maximum call stack size exceeded"),
        # Code that ends too soon (as a model's output cut short does), or closes what it never opened:
        # QuickJS finds these only in the runner's wrapping, so the brackets of the code say where.
        ("const r = await tools.echo({\n  a: [1, 2", "unexpected end of input: '[' is never closed (line 2, column 6)"),
        ("```js\nif (x) {\n  y()\n```", "unexpected end of input: '{' is never closed (line 2, column 8)"),
        ("return {", "unexpected end of input: '{' is never closed (line 1, column 8)"),
        ("const s = '{'; foo(`${s}`", "unexpected end of input: '(' is never closed (line 1, column 19)"),
        ("if (x) { y() }}", "Unexpected token '}' (line 1, column 15)"),
    ],
)
def test_engine_errors_say_where_in_the_code_as_sent(code: str, message: str) -> None:
    assert error(run(code)) == ("runtime_error", message)


def test_tool_result_proto_key_does_not_pollute() -> None:
    code = """
    const r = await tools.echo(1);
    [Object.getPrototypeOf(r) === Object.prototype, ({}).polluted === undefined, Object.keys(r)]
    """
    host = lambda p, t, v: json.loads('{"__proto__": {"polluted": true}, "a": 1}')
    assert value(run(code, host=host)) == [True, True, ["__proto__", "a"]]


def test_no_host_capabilities_are_reachable() -> None:
    code = "[typeof std, typeof os, typeof process, typeof require, typeof fetch, typeof setTimeout, typeof InternalError, typeof FinalizationRegistry]"
    assert value(run(code)) == ["undefined"] * 8


def test_prepare_stack_trace_cannot_be_hooked() -> None:
    code = (
        "Error.prepareStackTrace = () => 'hooked'; [typeof Error.prepareStackTrace, new Error('e').stack === 'hooked']"
    )
    assert value(run(code)) == ["undefined", False]


def test_bootstrap_survives_prototype_tampering() -> None:
    code = """
    Array.prototype.push = () => { throw new Error('push') };
    Map.prototype.set = () => { throw new Error('set') };
    JSON.stringify = () => '"forged"';
    Object.defineProperty(Object.prototype, 'toJSON', { value: () => 'forged' });
    Promise.prototype.then = function () { throw new Error('then') };
    console.log({ a: 1 });
    const r = await tools.echo({ a: [1, 2] });
    r
    """
    finished = run(code)
    assert json.loads(finished.result) == {"a": [1, 2]}


# Accessor keys on Object.prototype make every descriptor literal an accessor descriptor too.
DESCRIPTOR_TAMPERING = [
    "Object.prototype.get = function () { return 1 };",
    "Object.defineProperty(Object.prototype, 'set', { value: function () {}, configurable: true });",
]


@pytest.mark.parametrize("tamper", DESCRIPTOR_TAMPERING)
def test_host_errors_reach_a_guest_that_put_accessor_keys_on_object_prototype(tamper: str) -> None:
    def host(provider: str, tool: str, value: Any) -> Any:
        raise HostError("not_found", "no such thing")

    code = tamper + "let r; try { await tools.fail({}) } catch (e) { r = [e.code, e.message] } r"
    assert value(run(code, host=host)) == ["not_found", "no such thing"]
    unserializable = tamper + "let r; try { await tools.echo(() => 1) } catch (e) { r = e.code } r"
    assert value(run(unserializable)) == "serialization_error"


@pytest.mark.parametrize("tamper", DESCRIPTOR_TAMPERING)
def test_abort_ends_a_guest_that_put_accessor_keys_on_object_prototype(tamper: str) -> None:
    code = tamper + "try { await tools.echo(1) } catch (e) { console.log(e.code) }"
    guest = GuestRun(run_message(code, providers=[("tools", ["echo"])]))
    assert isinstance(guest.start(), ipc.ToolCalls)
    finished = guest.abort()
    assert (finished.code, finished.logs) == ("timeout", ["timeout"])


def test_queue_microtask_errors_fail_the_execution() -> None:
    assert error(run("queueMicrotask(() => { throw new Error('mt') }); await null; 1")) == ("runtime_error", "mt")


# ------------------------------------------------------------------ console


def test_console_formats_each_call_as_one_line() -> None:
    code = """
    console.log('a', 1, true, null, undefined, { b: [1] }, 10n, Symbol('s'));
    console.info('info'); console.warn('warn'); console.error('error');
    console.log(); console.log(NaN, () => 1);
    const c = {}; c.c = c; console.log(c);
    """
    assert run(code).logs == [
        'a 1 true null undefined {"b":[1]} 10 Symbol(s)',
        "info",
        "warn",
        "error",
        "",
        "null () => 1",
        "[object Object]",
    ]


# ------------------------------------------------------------------ serialization


@pytest.mark.parametrize(
    "code",
    [
        "1n",
        "({ a: 1n })",
        "Symbol('x')",
        "(function f() {})",
        "({ f() {} })",
        "NaN",
        "[Infinity]",
        "({ a: { b: -Infinity } })",
        "new Map()",
        "new Date(0)",
        "new (class A {})()",
        "const o = {}; o.self = o; o",
        "const a = []; a.push([a]); a",
        "new Uint8Array(2)",
        "/x/",
        "({ a: undefined, f() {} })",
        "[undefined, Symbol('s')]",
        "({ a: [undefined, () => 1] })",
    ],
)
def test_non_serializable_results_are_serialization_errors(code: str) -> None:
    assert error(run(code))[0] == "serialization_error"


def test_non_serializable_tool_input_rejects_without_a_tool_call() -> None:
    calls: list = []
    code = (
        "try { await tools.echo({ a: 1n }) } catch (e) { return [e.code, e.message.startsWith('Guest code passed')] }"
    )
    assert value(run(code, record=calls)) == ["serialization_error", True]
    assert calls == []
    assert error(run("await tools.echo(new Map())", record=calls))[0] == "serialization_error"
    assert calls == []


def test_output_larger_than_the_runner_limit_is_a_serialization_error() -> None:
    assert error(run("'x'.repeat(2000)", max_output=1000))[0] == "serialization_error"
    calls: list = []
    code = "try { await tools.echo('x'.repeat(600)) ; await Promise.all([tools.echo('y'.repeat(600)), tools.echo('z'.repeat(600))]) } catch (e) { return e.code }"
    assert value(run(code, max_output=1000, record=calls)) == "serialization_error"
    # The third input did not fit beside the second; Promise.all then rejected at once, and the
    # guest finished: the second still goes out, before the done, as every call it made does.
    assert [len(c[2]) for c in calls] == [600, 600]


def test_an_abort_ends_a_guest_that_queues_microtasks_forever() -> None:
    """Each job of an unwinding guest is an engine call with a budget of its own: a guest whose
    finally block queues a microtask that queues itself must not hold the abort (and its runner
    thread, and in ``hardened`` its whole worker) for good."""
    code = "try { await tools.echo(1) } finally { console.log('unwinding'); const again = () => queueMicrotask(again); again() }"
    guest = GuestRun(msgspec.structs.replace(run_message(code), providers=[("tools", ["echo"])]))
    assert isinstance(guest.start(), ipc.ToolCalls)
    finished: list[ipc.Finished] = []
    aborting = threading.Thread(target=lambda: finished.append(guest.abort()), daemon=True)
    aborting.start()
    aborting.join(30)  # without a bound on the unwinding it never ends
    assert finished, "the abort never ended"
    assert (finished[0].code, finished[0].logs) == ("timeout", ["unwinding"])


def test_an_abort_as_an_oversized_input_is_rejected_keeps_what_the_step_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """An Abort can arrive between a step's report and the rejection of an input too large to send:
    the step still reports the lines logged, and the abort then ends the execution as any other."""
    read_lines = GuestRun._logged

    def abort_arrives(guest: GuestRun, polled: list[str]) -> list[str]:
        lines = read_lines(guest, polled)
        guest.interrupt()  # what the interrupter does as the daemon's Abort arrives
        return lines

    monkeypatch.setattr(GuestRun, "_logged", abort_arrives)
    message = run_message("console.log('before'); await tools.echo('x'.repeat(600)); console.log('after')")
    guest = GuestRun(msgspec.structs.replace(message, providers=[("tools", ["echo"])], max_output_bytes=100))
    out = guest.start()
    assert isinstance(out, ipc.ToolCalls)
    assert (out.calls, out.logs) == ([], ["before"])
    finished = guest.abort()
    assert (finished.code, finished.logs) == ("timeout", [])


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("({ a: 1, b: undefined, c: { d: undefined, e: 2 } })", {"a": 1, "c": {"e": 2}}),
        ("[1, undefined, 3]", [1, None, 3]),
        ("[1, , 3]", [1, None, 3]),
        ("({ guestPolluted: undefined, toolPolluted: undefined })", {}),
        ("[{ a: undefined }, [undefined]]", [{}, [None]]),
    ],
)
def test_nested_undefined_follows_json_stringify(code: str, expected: object) -> None:
    assert value(run(code)) == expected
    calls: list = []
    run(f"await tools.echo({code})", record=calls)
    assert calls == [("tools", "echo", expected)]


def test_nested_undefined_leaves_rejections_and_their_paths_alone() -> None:
    assert error(run("({ a: undefined, b: [1, 2n] })")) == (
        "serialization_error",
        "Guest code returned a non-serializable value: bigint at $.b[1]",
    )


def test_plain_values_shared_and_null_prototype_objects_serialize() -> None:
    assert value(run("const x = { k: 1 }; [x, x, Object.assign(Object.create(null), { n: -0 })]")) == [
        {"k": 1},
        {"k": 1},
        {"n": 0},
    ]


# ------------------------------------------------------------------ limits


def test_deep_recursion_is_a_runtime_error() -> None:
    assert error(run("function f(n) { return f(n + 1) + 1 } f(0)")) == (
        "runtime_error",
        "Maximum call stack size exceeded",
    )


NESTINGS = {
    "blocks": lambda n: "{" * n + "}" * n,
    "arrays": lambda n: "[" * n + "]" * n,
    "parentheses": lambda n: "(" * n + "1" + ")" * n,
    "functions": lambda n: "function f() {" * n + "}" * n,
    "templates": lambda n: "`${" * n + "1" + "}`" * n,
    "unclosed": lambda n: "{" * n,
    "after a syntax error": lambda n: "@" + "{" * n + "}" * n,
}


@pytest.mark.parametrize("depth", [5_000, 50_000, 4_000_000])
@pytest.mark.parametrize("form", sorted(NESTINGS))
def test_code_nested_too_deeply_to_parse_fails_at_once(form: str, depth: int) -> None:
    """The engine's parser, with a bounded stack, refuses deep code before spending time on it, and
    tree-sitter never sees it; without the bound, 50,000 nested blocks ran into the timeout."""
    finished = run(NESTINGS[form](depth), budget=4)
    if form == "after a syntax error":  # the engine stops at the first error, as it would anyway
        assert (finished.code, finished.message) == (
            "runtime_error",
            "unexpected token in expression: '@' (line 1, column 1)",
        )
    else:
        assert (finished.code, finished.message) == ("runtime_error", "Code nested too deeply to parse"), finished


def test_code_nested_as_deep_as_programs_do_still_runs() -> None:
    depth = "let d = 0; for (let x = v; Array.isArray(x); x = x[0]) d++; d"
    assert value(run("{" * 800 + "}" * 800 + "; const v = " + "[" * 600 + "1" + "]" * 600 + "; " + depth)) == 600
    assert value(run("(" * 1000 + "2" + ")" * 1000 + " + 1")) == 3
    assert value(run("let x = 0; " + "if (true) " * 800 + "x = 5; x")) == 5


def test_a_too_deep_result_says_where_in_a_bounded_message() -> None:
    code, message = error(run("let v = 1; for (let i = 0; i < 5000; i++) v = [v]; v"))
    assert code == "serialization_error" and "nested deeper than 256 levels at $[0][0]" in message
    assert len(message) < 400 and message.endswith("[0][0]")


@pytest.mark.parametrize("depth", [1000, 9000, 10_000])
def test_recursion_as_deep_as_node_allows(depth: int) -> None:
    """Node gives a small recursive function ~10,800 frames; model-written tree walks need thousands."""
    assert value(run(f"function g(n) {{ return n ? 1 + g(n - 1) : 0 }} g({depth})")) == depth


@pytest.mark.parametrize(
    ("code", "code_or_value"),
    [
        ("tools.echo(1); tools.echo(2); 5", 5),
        ("tools.echo(1); await null; tools.echo(2); 5", 5),
        ("tools.echo(1); tools.echo(2); throw new Error('boom')", "runtime_error"),
        ("tools.echo(1); tools.echo(2); while (true) {}", "timeout"),
    ],
)
def test_calls_the_guest_never_awaits_go_out_before_it_ends(code: str, code_or_value: object) -> None:
    """A call made and never awaited is still the host's to run: the ``Finished`` carries it, however
    the execution ends (the daemon sends its ``tool_call`` before the ``done``)."""
    record: list[tuple[str, str, Any]] = []
    finished = run(code, budget=0.3, record=record)
    assert (value(finished) if finished.ok else finished.code) == code_or_value
    assert record == [("tools", "echo", 1), ("tools", "echo", 2)]
    assert [call_id for call_id, *_ in finished.calls] == [1, 2]


def test_an_abort_reports_the_calls_made_before_it_and_refuses_those_made_while_unwinding() -> None:
    guest = GuestRun(run_message("tools.echo(1); while (true) {}", providers=[("tools", ["echo"])], budget=60))
    poker = threading.Timer(0.05, lambda: [guest.interrupt() for _ in range(3)])
    poker.start()
    assert guest.start().calls == []  # stopped, not finished: the abort reports what it did
    finished = guest.abort()
    assert (finished.code, finished.calls) == ("timeout", [(1, "tools", "echo", b"1")])
    code = "try { await tools.echo(1) } finally { tools.echo(2); console.log('unwinding') }"
    guest = GuestRun(run_message(code, providers=[("tools", ["echo"])]))
    assert len(guest.start().calls) == 1
    finished = guest.abort()
    assert (finished.code, finished.logs, finished.calls) == ("timeout", ["unwinding"], [])


def test_an_unawaited_call_too_big_to_send_is_left_out_as_the_guest_ends() -> None:
    record: list[tuple[str, str, Any]] = []
    finished = run("tools.echo(1); tools.echo('x'.repeat(100)); 5", max_output=50, record=record)
    assert value(finished) == 5
    assert record == [("tools", "echo", 1)] and len(finished.calls) == 1


def test_spinning_guest_times_out_by_itself() -> None:
    finished = run("while (true) {}", budget=0.1)
    assert (finished.code, finished.message) == ("timeout", "Execution timed out")


def test_promise_job_storm_is_bounded_by_the_budget() -> None:
    """Each job queues the next and returns nothing: a chain of promises (``() => p.then(spin)``)
    would fill the heap instead, and on a fast machine stop at its memory limit within the budget."""
    storm = "const spin = () => { Promise.resolve().then(spin); }; spin(); await new Promise(() => {})"
    assert run(storm, budget=0.2).code == "timeout"


def test_abort_rejects_pending_tools_and_runs_finally_blocks() -> None:
    guest = GuestRun(
        run_message("try { await tools.echo(1) } finally { console.log('cleanup') }", providers=[("tools", ["echo"])])
    )
    assert isinstance(guest.start(), ipc.ToolCalls)
    finished = guest.abort()
    assert (finished.code, finished.logs) == ("timeout", ["cleanup"])


def test_a_spinning_guest_is_interrupted_from_another_thread_and_keeps_its_logs() -> None:
    assert native.SUPPORTED, "the quickjs binding's layout changed: cancel falls back to killing workers"
    guest = GuestRun(run_message("console.log('spin'); while (true) {}", budget=60))
    poker = threading.Timer(0.05, lambda: [guest.interrupt() for _ in range(3)])
    poker.start()
    started = time.monotonic()
    assert guest.start().calls == []  # stopped, not finished: the abort collects the logs
    assert time.monotonic() - started < 30  # interrupted, not left to its 60 s budget
    finished = guest.abort()
    assert (finished.code, finished.logs) == ("timeout", ["spin"])
    assert guest.interrupt() is False


def test_the_bootstrap_source_fallback_behaves_like_the_compiled_bootstrap(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "console.log('x'); const r = await tools.echo({ a: [1] }); [typeof InternalError, r]"
    compiled = run(code)
    monkeypatch.setattr(native, "SUPPORTED", False)
    assert run(code) == compiled
    assert value(compiled) == ["undefined", {"a": [1]}]


def test_abort_keeps_logs_even_when_the_unwinding_guest_spins() -> None:
    code = "try { await tools.echo(1) } finally { console.log('unwinding'); while (true) {} }"
    guest = GuestRun(run_message(code, providers=[("tools", ["echo"])]))
    assert isinstance(guest.start(), ipc.ToolCalls)
    finished = guest.abort()
    assert (finished.code, finished.logs) == ("timeout", ["unwinding"])


def test_results_that_arrive_together_resume_the_guest_once() -> None:
    """Ten parallel calls answered together: settled in order, then one step (one poll of the engine),
    not ten; each continuation still runs, in the order the results came."""
    code = (
        "const order = [];"
        " await Promise.all([1, 2, 3, 4, 5, 6, 7, 8, 9, 10].map((i) => tools.echo(i).then((r) => order.push(r))));"
        " order"
    )
    guest = GuestRun(run_message(code, providers=[("tools", ["echo"])]))
    started = guest.start()
    assert isinstance(started, ipc.ToolCalls) and len(started.calls) == 10
    polls = 0
    api = guest.api

    def counting(op: int, *args: Any) -> Any:
        nonlocal polls
        polls += op == guest_module._POLL
        return api(op, *args)

    guest.api = counting  # type: ignore[method-assign]
    answers = [ipc.Settle(call_id=call[0], ok=True, value=call[3]) for call in reversed(started.calls)]
    finished = guest.settle(*answers)
    assert isinstance(finished, ipc.Finished) and json.loads(finished.result or b"null") == list(range(10, 0, -1))
    assert polls == 1


def test_the_calls_of_one_report_fit_the_bound_however_often_the_guest_catches_a_rejection() -> None:
    """A guest that catches the rejection of an input too large to send and calls again, round after
    round, made one report (one frame to the daemon) hold a call of every round: past the daemon's
    bound on a worker's frames, which loses the worker and every execution it hosts, or past
    Python's recursion limit. The room is the report's: a call that no longer fits is rejected."""
    code = """const s = 'x'.repeat(60);
    for (let i = 0; i < 3000; i++) { tools.echo(s); try { await tools.echo(s) } catch (e) { console.log(e.code) } }
    await tools.echo(1)"""
    message = msgspec.structs.replace(run_message(code), providers=[("tools", ["echo"])], max_output_bytes=100)
    out = GuestRun(message).start()
    assert isinstance(out, ipc.ToolCalls)
    assert [raw for _, _, _, raw in out.calls] == [b'"' + b"x" * 60 + b'"', b"1"]
    assert out.logs == ["serialization_error"] * 5 + ["seria"]  # every round's rejection, to 100 characters


def test_the_largest_finished_a_guest_can_make_fits_the_daemons_bound_on_a_workers_frame() -> None:
    """Where no ring carries the log lines (``native.SHARES`` false, as off x86-64), the step's lines
    go with its report: with a result and a call of the largest size, that made a frame past the
    daemon's bound (twice --max-output-bytes, and 1 MiB), which loses the worker with every
    execution it hosts."""
    largest = 4 << 20
    code = f"""for (let i = 0; i < 8; i++) console.log('€'.repeat({largest // 6 // 8}));
    tools.echo('x'.repeat({largest - 10})); 'y'.repeat({largest - 10})"""
    message = msgspec.structs.replace(
        run_message(code, memory=256 << 20),
        providers=[("tools", ["echo"])],
        max_output_bytes=largest,
        max_log_lines=largest // 6,
        max_log_chars=largest // 6,
    )
    finished = GuestRun(message, streamed=False).start()
    assert isinstance(finished, ipc.Finished) and finished.ok
    assert (len(finished.calls), sum(map(len, finished.logs))) == (1, largest // 6 // 8 * 8)
    assert len(ipc.frame(1, finished)) <= ipc.max_frame(largest)
