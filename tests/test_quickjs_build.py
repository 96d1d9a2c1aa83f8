"""The QuickJS build in use: deploy/quickjs/build.py's edits, and that the arena size the
runner believes in is the one QuickJS really allocates with."""

from __future__ import annotations

import gc
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import weakref
from pathlib import Path
from types import ModuleType

import pytest
import quickjs

from execbox_runner.worker import memory_limit, native

BUILD_SCRIPT = Path(__file__).parent.parent / "deploy" / "quickjs" / "build.py"


def script(path: Path, name: str) -> ModuleType:
    """A script of ``deploy/`` loaded as a module (it is no package's)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


build = script(BUILD_SCRIPT, "quickjs_build")


def sdist_tree(root: Path) -> Path:
    """The files of quickjs-ng's sdist that the build writes to itself (the patches are applied to
    the real sdist by ``.ci/run``, which builds it and runs the suite on the result)."""
    (root / "quickjs").mkdir(parents=True)
    (root / "quickjs" / "__init__.py").write_text("import _quickjs\n")
    (root / "pyproject.toml").write_text(f'[project]\nname = "quickjs-ng"\nversion = "{build.VERSION}"\n')
    return root


def module_settings(tree: Path) -> dict[str, object]:
    """What the configured ``quickjs/__init__.py`` sets (without importing the extension)."""
    namespace: dict[str, object] = {}
    exec((tree / "quickjs" / "__init__.py").read_text().replace("import _quickjs\n", ""), namespace)
    return namespace


def test_the_series_names_every_patch_each_saying_what_and_why() -> None:
    names = [path.name for path in build.series()]
    assert sorted(path.name for path in build.PATCHES.glob("*.patch")) == names
    assert names == sorted(names) and len(set(names)) == len(names)
    for path in build.series():
        header = path.read_text().split("\n--- a/", 1)[0]
        assert header.count("\n") >= 4, f"{path.name}: its header says too little"
        for line in path.read_text().splitlines():
            assert line.startswith(("--- a/", "+++ b/")) or not line.startswith(("--- ", "+++ ")), (path.name, line)


def test_the_options_leave_out_the_patches_they_name() -> None:
    every = build.series()
    assert build.PATCHES / build.DISCARD_PATCH in every and build.PATCHES / build.LAZY_ACCESSORS_PATCH in every
    assert build.series(discard=False) == [path for path in every if path.name != build.DISCARD_PATCH]
    assert build.series(lazy_accessors=False) == [path for path in every if path.name != build.LAZY_ACCESSORS_PATCH]


def test_the_build_says_what_it_holds_and_labels_its_version(tmp_path: Path) -> None:
    tree = sdist_tree(tmp_path)
    build.configure(tree, 2048, discard=True, lazy_accessors=True, pgo=True)
    assert module_settings(tree) | {"__builtins__": None} == {
        "__builtins__": None,
        "ARENA_BYTES": 2048,
        "FIRST_ARENA_BYTES": 1024,
        "NATIVE_BUDGET": True,
        "LAZY_CLOCK": True,
        "DISCARDS_RUNTIMES": True,
        "LAZY_ACCESSORS": True,
        "PROFILE_GUIDED": True,
    }
    assert (
        f'version = "{build.VERSION}+arena2048.first1024.budget2.clock.lazy.discard.pgo"'
        in (tree / "pyproject.toml").read_text()
    )


@pytest.mark.parametrize(
    ("options", "setting", "version"),
    [
        ({"discard": False}, "DISCARDS_RUNTIMES", "+arena2048.first1024.budget2.clock.lazy.pgo"),
        ({"lazy_accessors": False}, "LAZY_ACCESSORS", "+arena2048.first1024.budget2.clock.discard.pgo"),
        ({"pgo": False}, "PROFILE_GUIDED", "+arena2048.first1024.budget2.clock.lazy.discard"),
    ],
)
def test_a_build_to_measure_against_says_what_it_leaves_out(
    tmp_path: Path, options: dict[str, bool], setting: str, version: str
) -> None:
    tree = sdist_tree(tmp_path)
    build.configure(tree, 2048, **{"discard": True, "lazy_accessors": True, "pgo": True, **options})
    assert module_settings(tree)[setting] is False
    assert f'version = "{build.VERSION}{version}"\n' in (tree / "pyproject.toml").read_text()


def test_the_profile_guided_builds_keep_the_interpreters_compiler_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """Setuptools compiles with the environment's ``CFLAGS`` in place of the interpreter's (its
    ``-O3``): a build that set only its own flags came out unoptimized, 4x slower."""
    monkeypatch.setenv("CFLAGS", "")
    monkeypatch.setenv("LDFLAGS", "-Wl,-z,now")
    env = build.with_flags(("-flto", "-fprofile-use=/p"), Path("/trainee"))
    assert env["CFLAGS"] == f"{sysconfig.get_config_var('CFLAGS')} -flto -fprofile-use=/p"
    assert env["LDFLAGS"] == "-Wl,-z,now -flto -fprofile-use=/p"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == "/trainee"
    monkeypatch.setenv("CFLAGS", "-O2 -march=x86-64-v2")  # an operator's own flags stay, first
    assert build.with_flags(("-flto",))["CFLAGS"] == "-O2 -march=x86-64-v2 -flto"


def test_every_training_program_ends_as_it_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that stopped doing what it says (a renamed code, a changed bootstrap) would train
    the build on an error path: the training run fails instead (here on the installed build)."""
    run = [sys.executable, str(build.TRAINING), "--rounds", "1"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=300, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    training = script(build.TRAINING, "quickjs_training")
    codes = {expected for _, expected in training.PROGRAMS}
    assert codes == {None, "runtime_error", "tool_error", "serialization_error", "timeout", "memory_limit"}
    monkeypatch.setattr(training, "PROGRAMS", [("return 1", "timeout")])
    assert training.train(1) == ["'return 1': None (), expected timeout"]


def test_the_build_refuses_an_sdist_it_was_not_written_for(tmp_path: Path) -> None:
    archive = sdist_archive(tmp_path / "quickjs_ng-0.17.0.2.tar.gz", ("quickjs_ng-0.17.0.2/setup.py", b"setup()\n"))
    with pytest.raises(SystemExit, match="not that of quickjs-ng"):
        build.verify(archive)
    tree = sdist_tree(tmp_path / "tree")
    (tree / "upstream-quickjs").mkdir()
    source = tree / "upstream-quickjs" / "quickjs.c"
    source.write_text("#define JS_ARENA_ALIGN             8\n#define JS_ARENA_SIZE 8192\n")
    with pytest.raises(SystemExit, match=re.escape(f"{build.series()[0].name} does not apply")):
        build.apply(tree, build.series())
    assert source.read_text().endswith("SIZE 8192\n")  # left as it was, with no backup or rejects beside it
    assert sorted(path.name for path in tree.rglob("*.*")) == ["__init__.py", "pyproject.toml", "quickjs.c"]
    (tree / "pyproject.toml").write_text('version = "0.16.0"\n')
    with pytest.raises(SystemExit, match="not quickjs-ng"):
        build.configure(tree, 2048, discard=True, lazy_accessors=True, pgo=True)


# A script's start: glibc's count of the C heap's bytes in use, mallinfo2().uordblks.
MALLINFO = """
import ctypes, quickjs
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = Info
"""


def run_alone(script: str) -> str:
    """What ``script`` prints, run by a fresh interpreter with one malloc arena (as workers run)."""
    env = {"MALLOC_ARENA_MAX": "1"}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout


FREE_ARENA_SPACE = (
    MALLINFO
    + """quickjs.Context()
before, counted, kept = mallinfo2().uordblks, 0, []
for _ in range(200):
    kept.append(quickjs.Context())
    counted += kept[-1].memory()["malloc_size"]
print((mallinfo2().uordblks - before - counted) / 200)
"""
)


def test_the_arena_sizes_in_use_are_the_ones_reported() -> None:
    """A fresh runtime's heap beyond what QuickJS counts is the free space of its partly used
    arenas, about 16 arenas' worth of the wheel's 4 KiB ones (~69 KiB) and 10 of the build's 2 KiB
    ones (~21 KiB): a build whose arenas are not ``ARENA_BYTES`` falls outside 8-24 of them. That
    space is mostly the size classes' last arenas, for most classes their first: about 14 arenas'
    worth when those are as large as the rest, about 10 when they are half as large
    (``FIRST_ARENA_BYTES``)."""
    free = float(run_alone(FREE_ARENA_SPACE))
    assert 8 * native.ARENA_BYTES <= free <= 24 * native.ARENA_BYTES, (free, native.ARENA_BYTES)
    if native.FIRST_ARENA_BYTES < native.ARENA_BYTES:
        assert free <= 12 * native.ARENA_BYTES, (free, native.ARENA_BYTES, native.FIRST_ARENA_BYTES)
    else:
        assert free >= 13 * native.ARENA_BYTES, (free, native.ARENA_BYTES)


# Runtimes that allocate in every way QuickJS can (small blocks, large blocks, large blocks grown
# by realloc, compiled regexps, typed arrays, pending jobs), each freed with its Context.
HEAP_LEFT_PER_RUNTIME = (
    MALLINFO
    + """code = '''
  const kept = [];
  for (let i = 0; i < 300; i++) kept.push({ i, s: "x".repeat(i * 3) });
  const grown = []; for (let i = 0; i < 5000; i++) grown.push(i);
  const big = "y".repeat(100000) + kept.length;
  const bytes = new Uint8Array(50000);
  Promise.resolve().then(() => kept.length);
  /a(b+)c/g.exec("abbbc")[1] + big.length + bytes.length + grown.length
'''
for _ in range(20):
    quickjs.Context().eval(code)
before = mallinfo2().uordblks
for _ in range(1000):
    quickjs.Context().eval(code)
print((mallinfo2().uordblks - before) / 1000)
"""
)


def test_a_freed_runtime_leaves_none_of_its_heap_behind() -> None:
    """Freed whole (``DISCARDS_RUNTIMES``) or object by object, a runtime's every block goes back
    to the C heap: a runtime or arena header left behind would be 2 KiB or more per runtime."""
    left = float(run_alone(HEAP_LEFT_PER_RUNTIME))
    assert left < 64, left


def test_the_standard_librarys_accessors_are_made_where_the_build_says() -> None:
    """On first use in the build (``LAZY_ACCESSORS``), once; with the runtime in QuickJS's own."""
    context = quickjs.Context()
    context.eval("Object.getOwnPropertyDescriptor(Object.prototype, 'toString')")  # the methods used below
    before = context.memory()["c_func_count"]
    assert context.eval("Object.getOwnPropertyDescriptor(Map.prototype, 'size').get.name") == "get size"
    made = context.memory()["c_func_count"] - before
    assert made == (1 if native.LAZY_ACCESSORS else 0)
    assert context.eval("new Map().size + Object.getOwnPropertyDescriptor(Map.prototype, 'size').get.length") == 0
    assert context.memory()["c_func_count"] - before == made


# What a guest can observe of accessors it has not read yet, through every path that looks at a
# property without reading it (flags only), and through those that define, freeze or delete one:
# the same in QuickJS's own build (checked against it: ``--eager-accessors``).
UNREAD_ACCESSORS = r"""
const r = [];
for (const [o, k] of [[Map.prototype, 'size'], [RegExp.prototype, 'flags'], [ArrayBuffer.prototype, 'byteLength'],
                      [Object.prototype, '__proto__'], [Object.getPrototypeOf(Uint8Array.prototype), 'length']]) {
  r.push([k, o.propertyIsEnumerable(k), Object.prototype.hasOwnProperty.call(o, k), Object.keys(o).includes(k)].join());
}
r.push(Object.isFrozen(Set.prototype), Object.isSealed(Set.prototype));
r.push(Reflect.set(Object.create(null), 'size', 1, Map.prototype));
(function () { 'use strict'; try { Object.create(Map.prototype).size = 3; } catch (e) { r.push(e.message); } })();
Object.freeze(Map.prototype);
const size = Object.getOwnPropertyDescriptor(Map.prototype, 'size');
r.push(Object.isFrozen(Map.prototype), size.get.name, size.set, size.configurable, size.enumerable, 'writable' in size);
r.push(new Map([[1, 1]]).size, delete RegExp.prototype.global, 'global' in RegExp.prototype, /a/g.flags);
Object.defineProperty(ArrayBuffer.prototype, 'byteLength', { get() { return 42; } });
Object.defineProperty(DataView.prototype, 'byteOffset', { value: 7 });
r.push(new ArrayBuffer(3).byteLength, new DataView(new ArrayBuffer(2)).byteOffset);
r.push(Object.prototype.__lookupSetter__.call(Object.prototype, '__proto__').name, ({ __proto__: Array.prototype }) instanceof Array);
r.push(Object.getOwnPropertyNames(Symbol.prototype).join(' '), Symbol('q').description, new Int16Array(3).byteLength);
r.join('|')
"""


def test_accessors_not_yet_read_look_as_they_do_in_quickjs() -> None:
    assert quickjs.Context().eval(UNREAD_ACCESSORS).split("|") == [
        *("size,false,true,false", "flags,false,true,false", "byteLength,false,true,false"),
        *("__proto__,false,true,false", "length,false,true,false"),
        *("false", "false", "false", "no setter for property"),
        *("true", "get size", "", "false", "false", "false"),
        *("1", "true", "false", "", "42", "7"),  # flags reads the deleted global
        *("set __proto__", "true", "toString valueOf description constructor", "q", "6"),
    ]


# Every accessor of every intrinsic, as it is made (on first use in the build): named and sized as
# QuickJS names its accessors, each of its own, and those told apart by a magic number (the
# RegExp flags, the typed arrays' views) answering each for its own.
ALL_ACCESSORS = r"""
const seen = new Set(), bad = [], getters = new Set();
let count = 0;
const walk = (o, path, depth) => {
  if (o === null || (typeof o !== 'object' && typeof o !== 'function') || seen.has(o) || depth > 4) return;
  seen.add(o);
  for (const key of Reflect.ownKeys(o)) {
    const d = Object.getOwnPropertyDescriptor(o, key);
    const name = typeof key === 'symbol' ? `[${key.description}]` : key;
    if ('value' in d) { walk(d.value, `${path}.${name}`, depth + 1); continue; }
    count++;
    if (d.get && (d.get.name !== `get ${name}` || d.get.length !== 0 || getters.has(d.get))) bad.push(`${path}.${name} get`);
    if (d.set && (d.set.name !== `set ${name}` || d.set.length !== 1)) bad.push(`${path}.${name} set`);
    if (d.get) getters.add(d.get);
  }
  walk(Object.getPrototypeOf(o), `${path}.__proto__`, depth + 1);
};
walk(globalThis, 'globalThis', 0);
const flags = ['d', 'g', 'i', 'm', 's', 'u', 'v', 'y'].map((f) => {
  const re = new RegExp('a', f);
  return [re.hasIndices, re.global, re.ignoreCase, re.multiline, re.dotAll, re.unicode, re.unicodeSets, re.sticky]
    .map(Number).join('');
});
const view = new DataView(new ArrayBuffer(16), 4, 8), floats = new Float64Array(new ArrayBuffer(32), 8, 2);
JSON.stringify({ count, bad, flags, sizes: [view.byteOffset, view.byteLength, floats.byteOffset, floats.byteLength, floats.length] })
"""


UNLISTED_ACCESSORS = (
    "globalThis.Object.create.__proto__.caller",
    "globalThis.Object.create.__proto__.arguments",
    "globalThis.Iterator.prototype.constructor",
)


def test_every_accessor_is_made_as_quickjs_makes_it() -> None:
    found = json.loads(quickjs.Context().eval(ALL_ACCESSORS))
    # Not made from a function list: %ThrowTypeError% (one function, unnamed, for both) and
    # Iterator.prototype.constructor, named as in QuickJS's own build either way.
    unlisted = [f"{path} {side}" for path in UNLISTED_ACCESSORS for side in ("get", "set")]
    assert found["count"] > 40 and found["bad"] == unlisted, found
    assert found["flags"] == [
        "10000000",
        "01000000",
        "00100000",
        "00010000",
        "00001000",
        "00000100",
        "00000010",
        "00000001",
    ]
    assert found["sizes"] == [4, 8, 8, 16, 2]


def test_the_time_limit_reads_the_clock_only_once_the_engine_checks_it() -> None:
    """In the build (``LAZY_CLOCK``), a call that ends before the engine's first check of its time
    limit reads no CPU clock (a system call); a call that runs on is still stopped by its limit,
    counted from that check. QuickJS's own build reads the clock as every call starts."""
    context = quickjs.Context()
    context.eval("0")  # a fresh context checks at its first poll (as a worker's bootstrap, with no limit set)
    context.set_time_limit(5.0)
    context.eval("1 + 1")
    start = native._word(context, native._START).value
    assert start == -2 if native.LAZY_CLOCK else start >= 0
    context.set_time_limit(0.05)
    with pytest.raises(quickjs.JSException, match="interrupted"):
        context.eval("while (true) {}")
    assert native._word(context, native._START).value >= 0
    context.set_time_limit(5.0)
    assert context.eval("let n = 0; for (let i = 0; i < 1e6; i++) n += i; n") == 499999500000


@pytest.mark.skipif(not native.NATIVE_BUDGET, reason="the tuned build's binding")
def test_the_binding_sets_and_reads_the_budget_checked_in_c() -> None:
    """The build's ``Context`` sets the budget in place of QuickJS's own limit and reads what it
    counts (``deploy/quickjs/patches/0006``), which ``MemoryLimit`` uses in place of ctypes."""
    assert memory_limit.budget_in_c()
    context = quickjs.Context()
    held, refusals = context.memory_budget()
    assert (held, refusals) == (context.memory()["malloc_size"], 0)
    context.set_memory_limit(1 << 20)
    context.set_memory_budget(held + (256 << 10))  # QuickJS's own limit off, this one on
    with pytest.raises(quickjs.JSException, match="out of memory"):
        context.eval('"x".repeat(1 << 21).length')
    assert context.memory_budget()[1] == 1
    context.set_memory_budget(0)  # none
    assert context.eval('globalThis.kept = "x".repeat(1 << 21); kept.length') == 1 << 21
    assert context.memory_budget()[0] == context.memory()["malloc_size"] > 1 << 21
    with pytest.raises(ValueError, match="negative"):
        context.set_memory_budget(-1)


def test_a_runtime_holding_a_python_callable_still_releases_it() -> None:
    """A Python callable in a runtime is released by its finalizer: such a runtime is never
    discarded whole, which would skip it."""

    class Echo:
        def __call__(self, value: object) -> object:
            return value

    echo = Echo()
    released = weakref.ref(echo)
    context = quickjs.Context()
    context.add_callable("echo", echo)
    del echo
    assert context.eval("echo(6 * 7)") == 42
    del context
    gc.collect()
    assert released() is None


def test_info_names_the_quickjs_build() -> None:
    run = [sys.executable, "-m", "execbox_runner", "info"]
    report = json.loads(subprocess.run([*run, "--json"], capture_output=True, timeout=60, check=True).stdout)
    version = importlib.metadata.version("quickjs-ng")
    assert report["quickjs"] == {
        "version": version,
        "tuned": native.NATIVE_BUDGET,
        "arena_bytes": native.ARENA_BYTES,
        "first_arena_bytes": native.FIRST_ARENA_BYTES,
        "discards_runtimes": native.DISCARDS_RUNTIMES,
        "lazy_accessors": native.LAZY_ACCESSORS,
        "lazy_clock": native.LAZY_CLOCK,
        "profile_guided": native.PROFILE_GUIDED,
        "budget_in_c": memory_limit.budget_in_c(),
    }
    freeing = "runtimes discarded whole" if native.DISCARDS_RUNTIMES else "runtimes freed object by object"
    budget = "memory budgets checked in C" if memory_limit.budget_in_c() else "memory budgets checked in Python hooks"
    text = subprocess.run(run, capture_output=True, text=True, timeout=60, check=True).stdout
    accessors = "accessors made on first use" if native.LAZY_ACCESSORS else "accessors made with each runtime"
    clock = "time limit's clock read at its first check" if native.LAZY_CLOCK else "time limit's clock read per call"
    compiled = "compiled profile-guided" if native.PROFILE_GUIDED else "compiled without a profile"
    build = "tuned build of deploy/quickjs/build.py" if native.NATIVE_BUDGET else "stock wheel from PyPI"
    arenas = f"{native.ARENA_BYTES // 1024} KiB arenas"
    if native.FIRST_ARENA_BYTES != native.ARENA_BYTES:
        arenas += f" (a size class's first {native.FIRST_ARENA_BYTES // 1024} KiB)"
    details = f"  {arenas}, {freeing}, {budget}, {accessors}, {clock}, {compiled}"
    lines = text.splitlines()
    assert lines[lines.index(f"engine: quickjs-ng {version} ({build})") + 1] == details


def sdist_archive(path: Path, *members: tuple[str, bytes | None]) -> Path:
    """A .tar.gz of ``members``: (name, bytes) for a file, (name, None) for a symlink to /etc/passwd."""
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path


# The interpreter's own way (extraction filters from Python 3.11.4 on), and the check made without them.
WAYS = pytest.mark.parametrize("filters", [True, False], ids=["this python", "python before 3.11.4"])
# What refuses a member: extraction filters raise their own errors; without them the build stops.
REFUSALS = (SystemExit, *((tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()))


@WAYS
def test_the_build_unpacks_an_sdist_on_every_python_it_supports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filters: bool
) -> None:
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = sdist_archive(tmp_path / "quickjs_ng.tar.gz", ("quickjs_ng/setup.py", b"setup()\n"))
    (tmp_path / "out").mkdir()
    build.extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "quickjs_ng" / "setup.py").read_bytes() == b"setup()\n"


@WAYS
@pytest.mark.parametrize("member", [("../escaped.py", b"x"), ("quickjs_ng/link", None)], ids=["parent path", "symlink"])
def test_the_build_refuses_an_sdist_member_that_would_escape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filters: bool, member: tuple[str, bytes | None]
) -> None:
    if not filters:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = sdist_archive(tmp_path / "quickjs_ng.tar.gz", member)
    (tmp_path / "out").mkdir()
    with pytest.raises(REFUSALS):
        build.extract(archive, tmp_path / "out")
    assert not (tmp_path / "escaped.py").exists()
    assert not (tmp_path / "out" / "quickjs_ng" / "link").exists()
