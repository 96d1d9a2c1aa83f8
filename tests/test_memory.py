"""memory_limit in real QuickJS: every real out-of-memory, at every limit, and nothing a guest can forge."""

import msgspec
import pytest

from execbox_runner.protocol import ipc
from execbox_runner.worker import memory_limit
from execbox_runner.worker.guest import GuestRun

from .guestkit import HostError, error, run, run_message, value

MIB = 1 << 20

SHAPES = {
    "object map": "const m = {}; for (let i = 0; ; i++) m['k' + i] = { i }",
    "arrays of arrays": "const a = []; while (true) a.push(new Array(1000).fill(a.length))",
    "many strings": "const a = []; for (let i = 0; ; i++) a.push('s' + i + 'x'.repeat(100))",
    "one big ArrayBuffer": "new ArrayBuffer(LIMIT)",
    "string doubling": "let s = 'x'; while (true) s += s",
    "string doubling, materialized": "let s = 'x'; while (true) { s += s; s.charCodeAt(s.length - 1) }",
    "deep JSON.parse": "const one = '['.repeat(1000) + ']'.repeat(1000); const keep = []; while (true) keep.push(JSON.parse(one))",
    "deep JSON.parse of a huge text": "JSON.parse('['.repeat(LIMIT) + ']'.repeat(LIMIT))",
    "in a nested frame": "function fill() { const m = []; for (;;) m.push({ a: [m.length] }) } fill()",
    "caught and rethrown": "try { const a = []; while (true) a.push(new Array(1000).fill(1)) } catch (e) { throw e }",
    "caught, rethrown as the guest's own": "try { const a = []; while (true) a.push([a.length]) } catch (e) { throw new Error('gave up') }",
}


@pytest.mark.parametrize("limit", [1, 8, 16, 64])
@pytest.mark.parametrize("shape", SHAPES)
def test_every_real_out_of_memory_is_memory_limit(shape: str, limit: int, budget: str) -> None:
    finished = run(SHAPES[shape].replace("LIMIT", str(limit * MIB)), memory=limit * MIB, budget=30)
    assert (finished.code, finished.message) == ("memory_limit", "Memory limit exceeded")


def test_a_limit_too_small_to_compile_the_code_is_memory_limit(budget: str) -> None:
    """The parser running out of memory is memory_limit, not "Code nested too deeply to parse" (it too
    fails otherwise with half the parse stack, the test for nesting), wherever the budget is checked."""
    finished = {kib: run("1 + 1", memory=kib << 10) for kib in (16, 32, 64, 96, 128, 256, 1024)}
    failed = {kib: (f.code, f.message) for kib, f in finished.items() if not f.ok}
    assert 16 in failed and 1024 not in failed
    assert set(failed.values()) == {("memory_limit", "Memory limit exceeded")}, failed


def test_out_of_memory_from_which_the_guest_recovers_is_not_a_failure(budget: str) -> None:
    code = "let n = 0; try { const a = []; while (true) a.push(new Array(1000).fill(n++)) } catch {} n > 0"
    assert value(run(code, memory=8 * MIB)) is True


def test_a_large_allocation_within_the_limit_succeeds(budget: str) -> None:
    assert value(run("new Uint8Array(40 << 20).length", memory=64 * MIB)) == 40 << 20


FORGERIES = {
    "null": "throw null",
    "null while holding most of the memory": "const keep = new Uint8Array(7 << 20); throw null",
    "the message": "throw new Error('out of memory')",
    "an InternalError from a caught 'string too long'": """
        try { let s = 'x'; while (true) s += s } catch (e) { throw new e.constructor('out of memory') }""",
    "Reflect.construct with InternalError's prototype": """
        let proto;
        try { let s = 'x'; while (true) s += s } catch (e) { proto = Object.getPrototypeOf(e) }
        function F() {}
        F.prototype = proto;
        throw Reflect.construct(Error, ['out of memory'], F)""",
    "a 'string too long' made by the guest": """
        try { let s = 'x'; while (true) s += s } catch (e) { throw Reflect.construct(Error, ['string too long'], e.constructor) }""",
    "a re-prototyped Error": """
        try { let s = 'x'; while (true) s += s } catch (e) {
          throw Object.setPrototypeOf(new Error('out of memory'), Object.getPrototypeOf(e))
        }""",
    "a real out-of-memory error kept past a tool call": """
        let kept;
        function fill() { const a = []; while (true) a.push(new Array(1000).fill(1)) }
        try { fill() } catch (e) { kept = e }
        await tools.echo(1);
        throw kept""",
    "a 'string too long' kept past a tool call": """
        let kept;
        try { let s = 'x'; while (true) s += s } catch (e) { kept = e }
        await tools.echo(1);
        throw kept""",
    "null after a tool call that followed a real out-of-memory": """
        function fill() { const a = []; while (true) a.push(new Array(1000).fill(1)) }
        try { fill() } catch {}
        await tools.echo(1);
        throw null""",
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_guests_cannot_forge_memory_limit(forgery: str) -> None:
    finished = run(FORGERIES[forgery], memory=8 * MIB)
    assert finished.code == "runtime_error", finished.message


def test_uninitialized_never_reaches_the_host() -> None:
    # QuickJS leaves no exception value at all when it cannot allocate an atom.
    finished = run("const m = {}; for (let i = 0; ; i++) m['k' + i] = { i }", memory=8 * MIB)
    assert "uninitialized" not in finished.message
    assert finished.code == "memory_limit"


def test_a_trusted_host_error_keeps_its_code_even_right_after_an_out_of_memory() -> None:
    def host(provider: str, tool: str, data: object) -> object:
        raise HostError("tool_error", "upstream down")

    code = "function fill() { const a = []; while (true) a.push([a.length]) }\ntry { fill() } catch {}\nawait tools.fail(1)"
    assert error(run(code, memory=8 * MIB, host=host)) == ("tool_error", "upstream down")


def test_without_the_native_layout_quickjs_enforces_the_limit_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_limit, "_defaults", None)
    big = SHAPES["one big ArrayBuffer"].replace("LIMIT", str(8 * MIB))
    assert error(run(big, memory=8 * MIB)) == ("memory_limit", "Memory limit exceeded")
    # Stopped too; but nothing is counted, and whether QuickJS's out-of-memory error survives a
    # run of small allocations or the guest sees a bare null depends on where the limit falls in
    # its arenas (32 limits around 8 MiB: 6 or 7 nulls, with any bootstrap).
    assert error(run(SHAPES["arrays of arrays"], memory=8 * MIB)) in {
        ("memory_limit", "Memory limit exceeded"),
        ("runtime_error", "null"),
    }
    assert error(run("throw null", memory=8 * MIB)) == ("runtime_error", "null")
    assert run(FORGERIES["an InternalError from a caught 'string too long'"]).code == "runtime_error"


def test_refusals_are_counted_per_runtime(budget: str) -> None:
    bomb = run_message(SHAPES["arrays of arrays"], budget=10, memory=8 * MIB)
    calm, bomber = GuestRun(msgspec.structs.replace(bomb, code="1")), GuestRun(bomb)
    finished = bomber.start()
    assert isinstance(finished, ipc.Finished) and finished.code == "memory_limit"
    assert calm.start() == ipc.Finished(ok=True, result=b"1", code=None, message="", logs=[])
    assert (bomber.memory.refusals > 0, calm.memory.refusals) == (True, 0)


def test_a_string_too_long_after_a_tool_call_is_a_runtime_error_with_its_position() -> None:
    # Nothing dates it: once a tool result has resumed the guest, it may be a kept one.
    finished = run("let s = 'x'\nawait tools.echo(1)\nwhile (true) s += s", memory=8 * MIB)
    assert error(finished) == ("runtime_error", "string too long (line 3, column 19)")
