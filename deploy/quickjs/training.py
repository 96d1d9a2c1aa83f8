"""The workload a profile-guided QuickJS build is trained on (``build.py``'s ``--pgo``, the default).

GCC lays out and inlines the engine for the paths this run takes, so it is the runner's own
path: each program runs as a worker runs it (``GuestRun``: a fresh runtime, the bootstrap, the
guest, its tool calls settled, the runtime freed), trivial executions most of all as in real
traffic, and around them the language and library a model writes (strings, numbers, arrays,
objects and classes, JSON, regular expressions, maps and sets, promises, errors, typed arrays,
big integers, dates) and the ends that are not ``ok``. Code no program reaches is still optimized
as usual (``-fprofile-partial-training``), only not for a path.

Every program's outcome is checked: a program that no longer does what it says would train
the build on an error path instead, so the run fails (and ``tests/test_quickjs_build.py`` runs
it against the installed build).

    python deploy/quickjs/training.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from typing import Final

from execbox_runner.protocol import ipc
from execbox_runner.worker.guest import GuestRun

PROVIDERS: Final = [("tools", ["echo", "search"]), ("db", ["query"])]
# A safety bound only: every program but the spinning one ends on its own well before it, but the
# instrumented build runs slowly, and on a loaded machine the memory bomb took over 2 s of wall time.
BUDGET_S: Final = 30.0
SPIN_BUDGET_S: Final = 0.02  # a program expected to time out spins this long
MEMORY_LIMIT: Final = 64 << 20

# (guest code, the outcome's code: None for ok). Each runs in a few milliseconds at most.
PROGRAMS: Final[list[tuple[str, str | None]]] = [
    ("1 + 1", None),
    ("return 42", None),
    ("return { ok: true, items: [1, 2, 3], name: 'x' }", None),
    ("return await tools.echo({ q: 'weather', n: 3 })", None),
    ("const [a, b] = await Promise.all([tools.echo({ i: 1 }), db.query({ sql: 'select 1' })]); return [a, b]", None),
    (
        "const out = []; for (let i = 0; i < 5; i++) { out.push(await tools.search({ page: i })); }"
        " console.log('pages', out.length); return out",
        None,
    ),
    (
        "const r = await Promise.allSettled([tools.echo(1), tools.search('a'), Promise.reject(new Error('no'))]);"
        " return r.map((x) => x.status)",
        None,
    ),
    ("tools.echo({ fire: 'and forget' }); return 'sent'", None),
    # strings
    (
        "let t = ''; for (let i = 0; i < 3000; i++) t += i.toString(36) + ','; const parts = t.split(',');"
        " return [parts.length, t.slice(0, 20), t.indexOf('zz'), t.includes('a1')]",
        None,
    ),
    (
        "const s = 'The Quick Brown Fox Jumps Over The Lazy Dog'; const w = s.toLowerCase().split(' ');"
        " return w.map((x) => x[0].toUpperCase() + x.slice(1)).join(' ').padEnd(60, '.').trim().length",
        None,
    ),
    (
        "const lines = []; for (let i = 0; i < 300; i++) lines.push(`row ${i}: ${(i / 7).toFixed(3)} | ${String(i).padStart(5, '0')}`);"
        " return lines.join('\\n').replace(/\\d+/g, (m) => m.length).length",
        None,
    ),
    (
        "const u = 'na\\u00efve caf\\u00e9 \\u{1F600} \\u65e5\\u672c'; return [u.length, [...u].length, u.normalize('NFD').length,"
        " encodeURIComponent(u), decodeURIComponent(encodeURIComponent(u)) === u, u.codePointAt(11), u.at(-1)]",
        None,
    ),
    (
        "const csv = Array.from({ length: 200 }, (_, i) => `${i},name${i},${i * 1.5}`).join('\\n');"
        " return csv.split('\\n').map((l) => l.split(',')).filter((c) => Number(c[2]) > 100).length",
        None,
    ),
    # numbers and math
    (
        "let s = 0; for (let i = 0; i < 20000; i++) { s += Math.sqrt(i) * Math.sin(i) + (i % 7) * (i >> 2) - (i ^ 5); }"
        " return [Math.round(s), (1234.5678).toFixed(2), (0.000123).toPrecision(2), parseInt('ff', 16), parseFloat('3.25e2'),"
        " Number.isInteger(5.0), (255).toString(2), Math.max(...[1, 9, 3]), Math.floor(-2.5), 2 ** 53]",
        None,
    ),
    (
        "let x = 1n; for (let i = 0; i < 300; i++) x = x * 3n + BigInt(i); return [x.toString().length, (x % 1000007n).toString(), typeof x]",
        None,
    ),
    # arrays
    (
        "const xs = Array.from({ length: 3000 }, (_, i) => (i * 7919) % 1009);"
        " const ys = xs.map((x) => x * 2).filter((x) => x % 3 === 0); ys.sort((a, b) => a - b);"
        " return [ys.length, ys.reduce((a, b) => a + b, 0), ys.find((x) => x > 500), ys.findIndex((x) => x > 900),"
        " ys.some((x) => x === 0), ys.every((x) => x >= 0), ys.indexOf(42), ys.includes(12), ys.slice(-3)]",
        None,
    ),
    (
        "const a = [5, 3, 8]; a.push(1); a.unshift(9); a.splice(2, 1, 7, 7); const b = [...a, ...[[1, [2]], 3]].flat(2);"
        " const names = ['delta', 'alpha', 'charlie', 'bravo']; names.sort(); names.reverse();"
        " return [a.pop(), a.shift(), b, names.join(), [1, 2, 3].flatMap((x) => [x, x * 10]), Array.isArray(b), a.at(-1)]",
        None,
    ),
    (
        "const grid = []; for (let r = 0; r < 60; r++) { const row = new Array(60); for (let c = 0; c < 60; c++) row[c] = r * c; grid.push(row); }"
        " let s = 0; for (const row of grid) for (const v of row) s += v; return s",
        None,
    ),
    # objects, classes, iteration
    (
        "const people = Array.from({ length: 300 }, (_, i) => ({ id: i, name: `p${i}`, age: 20 + (i % 50), tags: ['a', 'b'] }));"
        " const byAge = {}; for (const p of people) { (byAge[p.age] ??= []).push(p.id); }"
        " const { id, ...rest } = people[3]; return [Object.keys(byAge).length, Object.entries(rest).length,"
        " Object.assign({}, rest, { extra: 1 }), Object.fromEntries(Object.entries(byAge).slice(0, 2))]",
        None,
    ),
    (
        "class Shape { #id; static count = 0; constructor(id) { this.#id = id; Shape.count++; } get id() { return this.#id; } area() { return 0; } }"
        " class Rect extends Shape { constructor(id, w, h) { super(id); this.w = w; this.h = h; } area() { return this.w * this.h; } }"
        " class Circle extends Shape { constructor(id, r) { super(id); this.r = r; } area() { return Math.PI * this.r ** 2; } }"
        " const shapes = []; for (let i = 0; i < 500; i++) shapes.push(i % 2 ? new Rect(i, i, 2) : new Circle(i, i));"
        " return [Shape.count, Math.round(shapes.reduce((s, x) => s + x.area(), 0)), shapes[7].id, shapes[8] instanceof Shape]",
        None,
    ),
    (
        "function* range(n) { for (let i = 0; i < n; i++) yield i; } let s = 0; for (const i of range(2000)) s += i;"
        " const it = { from: 1, to: 50, [Symbol.iterator]() { let c = this.from, t = this.to; return { next: () => c <= t ? { value: c++, done: false } : { value: undefined, done: true } }; } };"
        " const p = new Proxy({}, { get: (o, k) => `got ${String(k)}` }); return [s, [...it].length, p.anything, Reflect.ownKeys({ a: 1, [Symbol('s')]: 2 }).length]",
        None,
    ),
    (
        "const make = (n) => { let count = 0; return () => { count += n; return count; }; }; const fns = [];"
        " for (let i = 0; i < 300; i++) fns.push(make(i)); let s = 0; for (const f of fns) { f(); s += f(); }"
        " function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); } return [s, fib(17)]",
        None,
    ),
    # JSON
    (
        "const doc = { users: Array.from({ length: 200 }, (_, i) => ({ id: i, email: `u${i}@example.com`, active: i % 3 === 0,"
        " score: i / 3, roles: ['r1', 'r2'], meta: { created: '2024-01-01', n: null } })) };"
        " const text = JSON.stringify(doc); const back = JSON.parse(text); const pretty = JSON.stringify(back.users.slice(0, 5), null, 2);"
        " return [text.length, back.users.filter((u) => u.active).length, pretty.length,"
        " JSON.stringify(back, (k, v) => (k === 'meta' ? undefined : v)).length]",
        None,
    ),
    # regular expressions
    (
        "const log = Array.from({ length: 200 }, (_, i) => `2024-05-${String(i % 28 + 1).padStart(2, '0')} ERROR [svc${i % 5}] code=${i}`).join('\\n');"
        " const re = /(?<date>\\d{4}-\\d{2}-\\d{2}) (?<level>\\w+) \\[(?<svc>[a-z0-9]+)\\] code=(?<code>\\d+)/g;"
        " const found = [...log.matchAll(re)].map((m) => m.groups.svc); const emails = 'a@b.co, x.y@z.org; bad@'.match(/[\\w.]+@[\\w.]+\\.\\w+/g);"
        " return [found.length, new Set(found).size, emails, /^\\p{Lu}/u.test('\\u00c9t\\u00e9'), 'a-b_c d'.split(/[-_ ]/), log.search(/svc3/)]",
        None,
    ),
    # maps, sets, dates
    (
        "const m = new Map(); for (let i = 0; i < 2000; i++) m.set(`k${i % 500}`, (m.get(`k${i % 500}`) ?? 0) + i);"
        " const s = new Set(); for (const [k, v] of m) if (v % 2) s.add(k); const w = new WeakMap(); const key = {}; w.set(key, 1);"
        " const d = new Date(Date.UTC(2024, 0, 31, 12)); d.setUTCDate(d.getUTCDate() + 1);"
        " return [m.size, s.size, w.has(key), d.toISOString(), Date.parse('2024-03-01T00:00:00Z'), new Date(0).getTime()]",
        None,
    ),
    # typed arrays
    (
        "const f = new Float64Array(5000); for (let i = 0; i < f.length; i++) f[i] = Math.sqrt(i);"
        " const u = new Uint8Array(4096); for (let i = 0; i < u.length; i++) u[i] = i * 31; const v = new DataView(u.buffer);"
        " return [Math.round(f.reduce((a, b) => a + b, 0)), u.subarray(10, 20).join(), v.getUint32(8), Array.from(new Int16Array([1, -2, 3]).map((x) => x * 2))]",
        None,
    ),
    # async
    (
        "async function depth(n) { return n === 0 ? 0 : 1 + (await depth(n - 1)); }"
        " const chain = await [1, 2, 3].reduce((p, x) => p.then((s) => s + x), Promise.resolve(0));"
        " const first = await Promise.race([new Promise((r) => r('fast')), tools.echo('slow')]);"
        " return [await depth(100), chain, first, await Promise.any([Promise.reject(1), Promise.resolve(2)])]",
        None,
    ),
    # logging
    (
        "for (let i = 0; i < 20; i++) console.log('step', i, { i, ok: i % 2 === 0 }, [i], null, undefined);"
        " console.warn('careful'); console.error(new Error('shown')); return 'logged'",
        None,
    ),
    # the ends that are not ok
    ("throw new Error('boom')", "runtime_error"),
    (
        "class AppError extends Error { constructor(m) { super(m); this.name = 'AppError'; } }"
        " try { null.x; } catch (e) { console.log(e.message); } finally { console.log('finally'); } throw new AppError('bad')",
        "runtime_error",
    ),
    ("return undefinedName + 1", "runtime_error"),
    ("return await db.query({ sql: 'fails' })", "tool_error"),
    ("const x = ;", "runtime_error"),
    ("return () => 1", "serialization_error"),
    ("await tools.nope()", "runtime_error"),
    ("while (true) {}", "timeout"),
    ("const held = []; for (;;) held.push('x'.repeat(1 << 16) + held.length);", "memory_limit"),
]

TRIVIAL_PER_ROUND: Final = 200  # trivial executions in each round, as in real traffic


def tool_answer(call: tuple[int, str, str, bytes | None]) -> ipc.Settle:
    """A tool's answer: ``db.query`` with ``fails`` rejects; every other call echoes its input."""
    call_id, provider, _tool, data = call
    if provider == "db" and data is not None and b"fails" in data:
        return ipc.Settle.reject(call_id, "tool_error", "the database is down")
    return ipc.Settle(call_id, True, b'{"echo":' + (data or b"null") + b',"rows":[[1,"a"],[2,"b"]]}')


def run(code: str, budget: float = BUDGET_S) -> ipc.Finished:
    """``code`` from start to end as a worker runs it, its tool calls answered in the order made
    (a guest awaiting none steps on until ``budget`` ends it)."""
    guest = GuestRun(ipc.Run(code, budget, MEMORY_LIMIT, 100, 64000, PROVIDERS, 1 << 24))
    out = guest.start()
    asked: deque[tuple[int, str, str, bytes | None]] = deque()
    while not isinstance(out, ipc.Finished):
        asked.extend(out.calls)
        out = guest.settle(tool_answer(asked.popleft())) if asked else guest.step()
    return out


def train(rounds: int) -> list[str]:
    """Run the programs ``rounds`` times; what went otherwise than each program says (in any
    round, once per program)."""
    wrong: dict[str, str] = {}
    for _ in range(rounds):
        for code, expected in PROGRAMS:
            finished = run(code, SPIN_BUDGET_S if expected == "timeout" else BUDGET_S)
            got = None if finished.ok else finished.code
            if got != expected:
                wrong.setdefault(code, f"{code[:60]!r}: {got} ({finished.message[:80]}), expected {expected}")
        for _ in range(TRIVIAL_PER_ROUND):
            run("1 + 1")
    return list(wrong.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    wrong = train(args.rounds)
    for line in wrong:
        print(f"training program went wrong: {line}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
