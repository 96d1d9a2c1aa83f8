"""Build quickjs-ng with smaller allocator arenas, memory budgets checked in C and a whole-runtime
discard, and install it into this interpreter's environment.

QuickJS-ng serves small allocations from 4 KiB arenas, one or more per size class (31 of
them), so a fresh runtime holds ~69 KiB of arena space it has not used yet. Every parked
execution is a runtime: with 2 KiB arenas each costs ~44 KiB less. The
arena size is a compile-time constant.

Every execution also ends by freeing its runtime, and ``JS_FreeRuntime`` runs the cycle
collector over every object of the runtime, then frees each object, shape, atom and string
alone: ~40 us of a worker's CPU per execution, most of it for the standard library's, which
the guest never touched. Yet every block of a runtime sits in its own arenas or is a large block of its
own, so the build adds ``JS_DiscardRuntime``, which frees those arenas, the large blocks (each
now linked in a list of its runtime's) and the runtime itself, touching no object, and the
binding's ``Context`` uses it when no Python callable lives in the runtime (execbox-runner
adds none; with one, finalizers must run and the full free is used).

execbox-runner enforces each execution's memory limit where the arena allocator asks the backing
allocator for memory (an arena, a large block), counting refusals (``worker/native.py``). Done in
Python allocator hooks, that is a ctypes callback taking the GIL back while the guest runs; the
build makes the same check in C (``js_budget_refuses``, its limit and count in ``JSMallocState``).

Every runtime also makes the standard library's accessors (``Map.prototype.size``,
``RegExp.prototype.flags``, the typed arrays' ``length``, ...) as it starts: a getter function
each, and a setter where there is one, whose names (``"get size"``) are new atoms; a trivial
execution touches almost none of them. QuickJS already makes its methods on first use (a placeholder property,
``JS_PROP_AUTOINIT``, realized by every path that reads, writes, defines or describes it); the
build does the same for the configurable accessors, the placeholder turning into the accessor
property as it is realized and reporting an accessor's flags before (51 function objects, 35 atoms
and ~10 KiB fewer in a runtime with the bootstrap loaded; ~10 us less to make and free one). What a guest can
observe is unchanged: the descriptors, names, lengths, enumerability and the errors of every
intrinsic property are the same either way (``tests/test_quickjs_build.py``).

The binding's time limit reads the process's CPU clock (a system call) as every call into the
engine starts; the build reads it at the engine's first check of the limit in the call instead,
so that the many calls that end before one read no clock (``LAZY_CLOCK``, ~7 us per trivial execution).

The engine is then compiled for the runner's own path (``--pgo``, the default): GCC instruments a
first build, ``training.py`` runs the runner's workload on it (fresh runtimes, the bootstrap, guests
and their tool calls, through execbox-runner's own ``GuestRun``), and the second build is laid out
and inlined by those counts, optimized at link time across the binding and the engine, with calls
to the engine's exported functions bound inside the library (``-fno-semantic-interposition``;
QuickJS is a shared object no one interposes). A trivial execution's whole runtime costs ~20% less
(docs/explanation/performance.md). Two such builds are not identical byte for byte: the counts of the
training's spinning and memory-bound guests follow the machine's speed (``--no-pgo`` builds are
as reproducible as before).

So this downloads the pinned quickjs-ng sdist from PyPI, makes those edits, labels the version
(``0.17.0.2+arena2048.budget.clock.lazy.discard.pgo``) and installs it with pip. It needs GCC and the
Python headers (and the environment's execbox-runner, for the training), and takes about two
minutes. execbox-runner also runs on the PyPI wheel; ``execbox-runner info`` says which build is in use.

Usage: ``.venv/bin/python deploy/quickjs/build.py [--arena-bytes 2048] [--no-discard] [--eager-accessors]
[--no-pgo] [--target DIR]`` (``--no-discard``, ``--eager-accessors`` or ``--no-pgo`` with ``--target
DIR`` builds one to measure against, for ``PYTHONPATH=DIR``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

PACKAGE = "quickjs-ng"
VERSION = "0.17.0.2"  # the sdist the edits below were written against
ARENA_LINE = "#define JS_ARENA_SIZE              4096\n"
# A 512-byte block (the largest size class) and the arena's 40-byte header must fit;
# larger than the stock 4096 only wastes more.
ARENA_CHOICES = (1024, 2048, 4096)


# The whole-runtime discard (see the module docstring): (file in the sdist, old text, new text).
QUICKJS_C = "upstream-quickjs/quickjs.c"
DISCARD: tuple[tuple[str, str, str], ...] = (
    # Each runtime lists its large blocks...
    (
        QUICKJS_C,
        """    _Alignas(JS_ARENA_ALIGN) uint8_t zero_size_block[sizeof(JSMallocBlockHeader)];
} JSArenaState;
""",
        """    _Alignas(JS_ARENA_ALIGN) uint8_t zero_size_block[sizeof(JSMallocBlockHeader)];
    struct list_head large_list; /* every large block, for JS_DiscardRuntime */
} JSArenaState;

/* A large block is preceded by its link in large_list. */
typedef struct JSLargeBlock {
    struct list_head link;
    JSMallocBlockHeader header;
} JSLargeBlock;
""",
    ),
    (
        QUICKJS_C,
        """    arena_zero_block(rt)->u.block_idx = JS_ARENA_FREE_NIL;
""",
        """    arena_zero_block(rt)->u.block_idx = JS_ARENA_FREE_NIL;
    init_list_head(&s->large_list);
""",
    ),
    # ... as each is allocated (malloc and calloc) ...
    *(
        (
            QUICKJS_C,
            f"""    JSMallocBlockHeader *b;
    b = rt->mf.js_{call}(rt->malloc_state.opaque,{args}
                         sizeof(JSMallocBlockHeader) + size);
    if (!b)
        return NULL;
""",
            f"""    JSMallocBlockHeader *b;
    JSLargeBlock *l;
    l = rt->mf.js_{call}(rt->malloc_state.opaque,{args}
                         sizeof(JSLargeBlock) + size);
    if (!l)
        return NULL;
    list_add(&l->link, &rt->arena_state.large_list);
    b = &l->header;
""",
        )
        for call, args in (("malloc", ""), ("calloc", " 1,"))
    ),
    # ... freed ...
    (
        QUICKJS_C,
        """        } else {
            rt->mf.js_free(rt->malloc_state.opaque, b);
        }
""",
        """        } else {
            JSLargeBlock *l = container_of(b, JSLargeBlock, header);
            list_del(&l->link);
            rt->mf.js_free(rt->malloc_state.opaque, l);
        }
""",
    ),
    # ... measured ...
    (
        QUICKJS_C,
        """            size_t size = rt->mf.js_malloc_usable_size(b);
            if (size != 0)
                size -= sizeof(JSMallocBlockHeader);
""",
        """            size_t size = rt->mf.js_malloc_usable_size(container_of(b, JSLargeBlock, header));
            if (size != 0)
                size -= sizeof(JSLargeBlock);
""",
    ),
    # ... or moved by realloc.
    (
        QUICKJS_C,
        """            JSMallocBlockHeader *nb;
            nb = rt->mf.js_realloc(rt->malloc_state.opaque, b,
                                   sizeof(JSMallocBlockHeader) + size);
            if (!nb)
                return NULL;
""",
        """            JSMallocBlockHeader *nb;
            JSLargeBlock *l = container_of(b, JSLargeBlock, header), *nl;
            list_del(&l->link);
            nl = rt->mf.js_realloc(rt->malloc_state.opaque, l,
                                   sizeof(JSLargeBlock) + size);
            if (!nl) {
                list_add(&l->link, &rt->arena_state.large_list);
                return NULL;
            }
            list_add(&nl->link, &rt->arena_state.large_list);
            nb = &nl->header;
""",
    ),
    (
        QUICKJS_C,
        """void JS_FreeRuntime(JSRuntime *rt)
{
""",
        """/* Free every block of a runtime that nothing will use again: its arenas, its large
   blocks and the runtime itself, with no finalizer, no cycle collection and no walk of
   its objects. Nothing outside the runtime may hold a reference into it. */
void JS_DiscardRuntime(JSRuntime *rt)
{
    struct list_head *el, *el1;
    js_arena_free_all(rt);
    list_for_each_safe(el, el1, &rt->arena_state.large_list) {
        rt->mf.js_free(rt->malloc_state.opaque, list_entry(el, JSLargeBlock, link));
    }
    rt->mf.js_free(rt->malloc_state.opaque, rt);
}

void JS_FreeRuntime(JSRuntime *rt)
{
""",
    ),
    (
        "upstream-quickjs/quickjs.h",
        "JS_EXTERN void JS_FreeRuntime(JSRuntime *rt);\n",
        "JS_EXTERN void JS_FreeRuntime(JSRuntime *rt);\nJS_EXTERN void JS_DiscardRuntime(JSRuntime *rt);\n",
    ),
    # The binding discards a runtime that holds no Python callable: nothing outside it then
    # refers into it (its Objects keep the Context alive), and no finalizer has work to do.
    (
        "module.c",
        """	JS_FreeContext(self->context);
	JS_FreeRuntime(self->runtime);
""",
        """	if (self->python_callables == NULL) {
		JS_DiscardRuntime(self->runtime);
	} else {
		JS_FreeContext(self->context);
		JS_FreeRuntime(self->runtime);
	}
""",
    ),
)


# The memory budget in C (see the module docstring): the fields of a runtime's allocator state,
# the arena allocator's four requests to the backing allocator routed through the check (each
# call text and how often it occurs), and the check itself, defined ahead of its first use.
BUDGET: tuple[tuple[str, str, str], ...] = (
    (
        QUICKJS_C,
        """    void *opaque; /* user opaque */
} JSMallocState;
""",
        """    void *opaque; /* user opaque */
    size_t budget_limit; /* execbox-runner: 0, or the budget js_budget_refuses enforces */
    size_t budget_refusals; /* requests it refused */
} JSMallocState;
""",
    ),
)
BUDGET_CALLS: tuple[tuple[str, str, int], ...] = (
    ("rt->mf.js_malloc(rt->malloc_state.opaque,", "js_budget_malloc(rt,", 2),
    ("rt->mf.js_calloc(rt->malloc_state.opaque,", "js_budget_calloc(rt,", 1),
    ("rt->mf.js_realloc(rt->malloc_state.opaque,", "js_budget_realloc(rt,", 1),
)
BUDGET_CHECK = (
    QUICKJS_C,
    "static no_inline JSArena *arena_new(JSRuntime *rt, int block_size_idx)\n",
    """/* execbox-runner's memory budget (budget_limit; 0: none), checked where the arena allocator
   asks the backing allocator for memory (an arena of small blocks, a large block): a request
   that would take malloc_size past the limit is refused and counted. Once one was, requests no
   larger than an arena may pass the limit by JS_BUDGET_RESERVE, so that QuickJS can still make
   its out-of-memory error. */
#define JS_BUDGET_RESERVE ((ptrdiff_t)64 << 10)

static bool js_budget_refuses(JSRuntime *rt, ptrdiff_t size)
{
    JSMallocState *s = &rt->malloc_state;
    ptrdiff_t limit = (ptrdiff_t)s->budget_limit;
    ptrdiff_t after = (ptrdiff_t)s->malloc_size + size;

    if (limit == 0 || after <= limit)
        return false;
    if (s->budget_refusals != 0 && size <= JS_ARENA_SIZE && after <= limit + JS_BUDGET_RESERVE)
        return false;
    s->budget_refusals++;
    return true;
}

static void *js_budget_malloc(JSRuntime *rt, size_t size)
{
    if (js_budget_refuses(rt, (ptrdiff_t)size))
        return NULL;
    return rt->mf.js_malloc(rt->malloc_state.opaque, size);
}

static void *js_budget_calloc(JSRuntime *rt, size_t count, size_t size)
{
    if (js_budget_refuses(rt, (ptrdiff_t)(count * size)))
        return NULL;
    return rt->mf.js_calloc(rt->malloc_state.opaque, count, size);
}

static void *js_budget_realloc(JSRuntime *rt, void *ptr, size_t size)
{
    ptrdiff_t held = ptr ? (ptrdiff_t)rt->mf.js_malloc_usable_size(ptr) : 0;

    if (js_budget_refuses(rt, (ptrdiff_t)size - held))
        return NULL;
    return rt->mf.js_realloc(rt->malloc_state.opaque, ptr, size);
}

static no_inline JSArena *arena_new(JSRuntime *rt, int block_size_idx)
""",
)


# The accessors made on first use (see the module docstring): the predicate and the maker of an
# accessor's functions, the placeholder turned into the accessor where any placeholder is
# realized, its flags reported as an accessor's before it is, and the function list's accessors
# defined as placeholders (configurable ones only: a non-configurable placeholder would fail
# the checks of Object.defineProperty meant for accessors; those are made at once by the same
# maker, in place of QuickJS's own copy of it).
LAZY_ACCESSORS: tuple[tuple[str, str, str], ...] = (
    (
        QUICKJS_C,
        """static JSAutoInitIDEnum js_autoinit_get_id(JSProperty *pr)
{
    return pr->u.init.realm_and_id & 3;
}
""",
        """static JSAutoInitIDEnum js_autoinit_get_id(JSProperty *pr)
{
    return pr->u.init.realm_and_id & 3;
}

/* An accessor of a function list, made on first use. */
static bool js_autoinit_is_getset(JSProperty *pr)
{
    const JSCFunctionListEntry *e = pr->u.init.opaque;
    return js_autoinit_get_id(pr) == JS_AUTOINIT_ID_PROP &&
           (e->def_type == JS_DEF_CGETSET || e->def_type == JS_DEF_CGETSET_MAGIC);
}

static int js_instantiate_getset(JSContext *ctx, const JSCFunctionListEntry *e,
                                 JSValue *pgetter, JSValue *psetter);
""",
    ),
    (
        QUICKJS_C,
        """    realm = js_autoinit_get_realm(pr);
""",
        """    realm = js_autoinit_get_realm(pr);
    if (js_autoinit_is_getset(pr)) {
        JSValue getter, setter;
        int ret = js_instantiate_getset(realm, pr->u.init.opaque, &getter, &setter);
        js_autoinit_free(ctx->rt, pr);
        if (ret) {
            prs->flags &= ~JS_PROP_TMASK;
            pr->u.value = JS_UNDEFINED;
            return -1;
        }
        prs->flags = (prs->flags & ~(JS_PROP_TMASK | JS_PROP_WRITABLE)) | JS_PROP_GETSET;
        pr->u.getset.getter = JS_IsUndefined(getter) ? NULL : JS_VALUE_GET_OBJ(getter);
        pr->u.getset.setter = JS_IsUndefined(setter) ? NULL : JS_VALUE_GET_OBJ(setter);
        return 0;
    }
""",
    ),
    (
        QUICKJS_C,
        """                if ((prs->flags & JS_PROP_TMASK) == JS_PROP_GETSET)
                    *pflags |= JS_PROP_GETSET;
""",
        """                if ((prs->flags & JS_PROP_TMASK) == JS_PROP_GETSET ||
                    ((prs->flags & JS_PROP_TMASK) == JS_PROP_AUTOINIT && js_autoinit_is_getset(pr)))
                    *pflags |= JS_PROP_GETSET;
""",
    ),
    (
        QUICKJS_C,
        """static int JS_InstantiateFunctionListItem(JSContext *ctx, JSValueConst obj,
                                          JSAtom atom,
                                          const JSCFunctionListEntry *e)
{""",
        """static int js_instantiate_getset(JSContext *ctx, const JSCFunctionListEntry *e,
                                 JSValue *pgetter, JSValue *psetter)
{
    JSValue getter, setter;
    char buf[64];

    getter = JS_UNDEFINED;
    if (e->u.getset.get.generic) {
        snprintf(buf, sizeof(buf), "get %s", e->name);
        getter = JS_NewCFunction2(ctx, e->u.getset.get.generic,
                                  buf, 0, e->def_type == JS_DEF_CGETSET_MAGIC ? JS_CFUNC_getter_magic : JS_CFUNC_getter,
                                  e->magic);
        if (JS_IsException(getter))
            return -1;
    }
    setter = JS_UNDEFINED;
    if (e->u.getset.set.generic) {
        snprintf(buf, sizeof(buf), "set %s", e->name);
        setter = JS_NewCFunction2(ctx, e->u.getset.set.generic,
                                  buf, 1, e->def_type == JS_DEF_CGETSET_MAGIC ? JS_CFUNC_setter_magic : JS_CFUNC_setter,
                                  e->magic);
        if (JS_IsException(setter)) {
            JS_FreeValue(ctx, getter);
            return -1;
        }
    }
    *pgetter = getter;
    *psetter = setter;
    return 0;
}

static int JS_InstantiateFunctionListItem(JSContext *ctx, JSValueConst obj,
                                          JSAtom atom,
                                          const JSCFunctionListEntry *e)
{""",
    ),
    (
        QUICKJS_C,
        """    case JS_DEF_CGETSET: /* XXX: use autoinit again ? */
    case JS_DEF_CGETSET_MAGIC:
        {
            JSValue getter, setter;
            char buf[64];

            getter = JS_UNDEFINED;
            if (e->u.getset.get.generic) {
                snprintf(buf, sizeof(buf), "get %s", e->name);
                getter = JS_NewCFunction2(ctx, e->u.getset.get.generic,
                                          buf, 0, e->def_type == JS_DEF_CGETSET_MAGIC ? JS_CFUNC_getter_magic : JS_CFUNC_getter,
                                          e->magic);
            }
            setter = JS_UNDEFINED;
            if (e->u.getset.set.generic) {
                snprintf(buf, sizeof(buf), "set %s", e->name);
                setter = JS_NewCFunction2(ctx, e->u.getset.set.generic,
                                          buf, 1, e->def_type == JS_DEF_CGETSET_MAGIC ? JS_CFUNC_setter_magic : JS_CFUNC_setter,
                                          e->magic);
            }
            JS_DefinePropertyGetSet(ctx, obj, atom, getter, setter, prop_flags);
            return 0;
        }
""",
        """    case JS_DEF_CGETSET:
    case JS_DEF_CGETSET_MAGIC:
        if (prop_flags & JS_PROP_CONFIGURABLE) {
            /* made on first use (see JS_AutoInitProperty) */
            JS_DefineAutoInitProperty(ctx, obj, atom, JS_AUTOINIT_ID_PROP,
                                      (void *)e, prop_flags & ~JS_PROP_WRITABLE);
            return 0;
        }
        {
            JSValue getter, setter;

            if (js_instantiate_getset(ctx, e, &getter, &setter))
                return -1;
            JS_DefinePropertyGetSet(ctx, obj, atom, getter, setter, prop_flags);
            return 0;
        }
""",
    ),
)


# The binding's time limit counts the process's CPU time (``clock()``) from the start of every call
# into the engine, and a process CPU clock is a system call (~0.6 us here, more under load): six
# per trivial execution, though most calls end before the engine first checks the limit. The
# build reads the clock at that first check instead (JS_TIME_LIMIT_UNSTARTED until then): the
# limit counts from there, after at most one interval between checks (~10,000 of the engine's
# interrupt-counter ticks), which a backstop armed with seconds and a 2 ms unwinding budget allow.
LAZY_CLOCK: tuple[tuple[str, str, str], ...] = (
    (
        "module.c",
        """static int js_interrupt_handler(JSRuntime *rt, void *opaque) {
	InterruptData *data = opaque;
	if (clock() - data->start >= data->limit) {
""",
        """#define JS_TIME_LIMIT_UNSTARTED ((clock_t)-2) /* execbox-runner: not read yet in this call */

static int js_interrupt_handler(JSRuntime *rt, void *opaque) {
	InterruptData *data = opaque;
	clock_t now = clock();
	if (data->start == JS_TIME_LIMIT_UNSTARTED) {
		data->start = now;
	}
	if (now - data->start >= data->limit) {
""",
    ),
    (
        "module.c",
        """		interrupt_data->start = clock();
""",
        """		interrupt_data->start = JS_TIME_LIMIT_UNSTARTED;
""",
    ),
)


def label(arena_bytes: int, discard: bool = True, lazy_accessors: bool = True, pgo: bool = True) -> str:
    """The version the build installs as: PEP 440 ignores the local label when matching
    ``quickjs-ng>=0.17``, so the project's requirement still holds."""
    return (
        f"{VERSION}+arena{arena_bytes}.budget.clock"
        + (".lazy" if lazy_accessors else "")
        + (".discard" if discard else "")
        + (".pgo" if pgo else "")
    )


def edit_once(text: str, old: str, new: str, where: str, times: int = 1) -> str:
    """``text`` with its ``times`` ``old`` replaced; another count means the sdist is not the one expected."""
    found = text.count(old)
    if found != times:
        raise SystemExit(
            f"{where}: expected {times} of {old.strip()!r}, found {found}: not quickjs-ng {VERSION}'s sdist"
        )
    return text.replace(old, new)


def patch(tree: Path, arena_bytes: int, discard: bool = True, lazy_accessors: bool = True, pgo: bool = True) -> None:
    arena = (QUICKJS_C, ARENA_LINE, ARENA_LINE.replace("4096", str(arena_bytes)))
    edits = (
        arena,
        *BUDGET,
        *LAZY_CLOCK,
        *(DISCARD if discard else ()),
        *(LAZY_ACCESSORS if lazy_accessors else ()),
    )
    for name, old, new in edits:
        source = tree / name
        source.write_text(edit_once(source.read_text(), old, new, str(source)))
    source = tree / QUICKJS_C
    text = source.read_text()
    for old, new, times in BUDGET_CALLS:
        text = edit_once(text, old, new, str(source), times)
    source.write_text(edit_once(text, *BUDGET_CHECK[1:], str(source)))
    module = tree / "quickjs" / "__init__.py"
    with module.open("a") as init:  # read by execbox_runner.worker.native
        init.write(
            f"\n# Set by execbox-runner's deploy/quickjs/build.py.\nARENA_BYTES = {arena_bytes}\n"
            f"NATIVE_BUDGET = True\nLAZY_CLOCK = True\nDISCARDS_RUNTIMES = {discard}\nLAZY_ACCESSORS = {lazy_accessors}\n"
            f"PROFILE_GUIDED = {pgo}\n"
        )
    version = label(arena_bytes, discard, lazy_accessors, pgo)
    project = tree / "pyproject.toml"
    project.write_text(
        edit_once(project.read_text(), f'version = "{VERSION}"\n', f'version = "{version}"\n', str(project))
    )


def extract(archive: Path, where: Path) -> None:
    """Unpack ``archive`` into ``where``. Python 3.11.4 and later filter its members ("data": no
    absolute or parent paths, no links out, no devices); earlier 3.11 releases have no filters,
    so there a member that is not a plain file or directory, or would land outside ``where``,
    stops the build instead."""
    with tarfile.open(archive) as sdist:
        if hasattr(tarfile, "data_filter"):
            sdist.extractall(where, filter="data")
            return
        root = where.resolve()
        members = sdist.getmembers()
        for member in members:
            if not (member.isfile() or member.isdir()) or not (root / member.name).resolve().is_relative_to(root):
                raise SystemExit(f"{archive.name}: refusing to extract {member.name!r}")
        sdist.extractall(where, members=members)  # noqa: S202 - every member checked above


def pip(*args: str, env: Mapping[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], env=env, check=True)


# Both builds of ``--pgo``: link-time optimization across the binding and the engine, in one
# partition (split into several, the instrumented library referred to a local label of another
# and would not load: "undefined symbol: .L1"), and the engine's exported functions called
# directly inside the library (none is interposed).
OPTIMIZED = ("-fno-semantic-interposition", "-flto", "-flto-partition=one")
TRAINING = Path(__file__).with_name("training.py")
TRAINING_ROUNDS = 20


def with_flags(flags: tuple[str, ...], pythonpath: Path | None = None) -> dict[str, str]:
    """This environment with ``flags`` added to the C compiler's and the linker's, and
    ``pythonpath`` first on the import path. Setuptools compiles with ``CFLAGS`` from the
    environment instead of the interpreter's own (``-O3``, ...), so those come first."""
    env = dict(os.environ)
    env["CFLAGS"] = env.get("CFLAGS") or sysconfig.get_config_var("CFLAGS") or ""
    for name in ("CFLAGS", "LDFLAGS"):
        env[name] = " ".join(filter(None, (env.get(name, ""), *flags)))
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(pythonpath), env.get("PYTHONPATH", ""))))
    return env


def install(tree: Path, target: Path | None, env: Mapping[str, str] | None = None) -> None:
    """Build ``tree`` from scratch and install it into the environment, or into ``target``."""
    shutil.rmtree(tree / "build", ignore_errors=True)  # objects of an earlier build would be reused
    where_to = ["--target", str(target), "--upgrade"] if target else []
    pip("install", "--quiet", "--no-deps", "--force-reinstall", *where_to, str(tree), env=env)


def install_trained(tree: Path, target: Path | None, scratch: Path) -> None:
    """Build ``tree`` instrumented, run ``training.py`` on it, then build and install it laid out
    by the counts. The second build compiles the same objects at the same paths, so each finds
    its counts, and a unit without them fails the build (``-Werror=missing-profile``)."""
    profiles, trainee = scratch / "profiles", scratch / "trainee"
    install(tree, trainee, with_flags((*OPTIMIZED, f"-fprofile-generate={profiles}", "-fprofile-update=prefer-atomic")))
    print("training it on the runner's workload", flush=True)
    training = [sys.executable, str(TRAINING), "--rounds", str(TRAINING_ROUNDS)]
    subprocess.run(training, env=with_flags((), trainee), check=True, timeout=900)
    use = (f"-fprofile-use={profiles}", "-fprofile-partial-training", "-fprofile-correction", "-Werror=missing-profile")
    print("building it by the counts", flush=True)
    install(tree, target, with_flags((*OPTIMIZED, *use)))


def installed(target: Path | None) -> str | None:
    """The version of quickjs-ng in this environment, or in ``target``."""
    try:
        if target is None:
            return importlib.metadata.version(PACKAGE)
        (found,) = importlib.metadata.distributions(name=PACKAGE, path=[str(target)])
        return found.version
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arena-bytes", type=int, choices=ARENA_CHOICES, default=2048)
    parser.add_argument(
        "--no-discard", dest="discard", action="store_false", help="leave out JS_DiscardRuntime (to measure against)"
    )
    parser.add_argument(
        "--eager-accessors",
        dest="lazy_accessors",
        action="store_false",
        help="make every accessor with its runtime, as QuickJS does (to measure against)",
    )
    parser.add_argument(
        "--no-pgo",
        dest="pgo",
        action="store_false",
        help="compile once, without the training run's profile (to measure against)",
    )
    parser.add_argument(
        "--target", type=Path, help="install into this directory (for PYTHONPATH) instead of the environment"
    )
    args = parser.parse_args()
    wanted = label(args.arena_bytes, args.discard, args.lazy_accessors, args.pgo)
    if installed(args.target) == wanted:
        print(f"{PACKAGE} {wanted} is installed already")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(scratch)
        pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}", "--dest", scratch)
        (archive,) = where.glob("*.tar.gz")
        extract(archive, where)
        tree = where / archive.name.removesuffix(".tar.gz")
        patch(tree, args.arena_bytes, args.discard, args.lazy_accessors, args.pgo)
        print(f"building {PACKAGE} {wanted} (about {'two minutes' if args.pgo else 'a minute'})", flush=True)
        if args.pgo:
            try:
                install_trained(tree, args.target, where)
            except subprocess.CalledProcessError as exc:
                raise SystemExit(
                    f"the profile-guided build failed ({exc}): it needs GCC, and execbox-runner installed in this "
                    "environment for the training; --no-pgo builds without a profile"
                ) from exc
        else:
            install(tree, args.target)
    probe = (
        f"import quickjs; assert quickjs.ARENA_BYTES == {args.arena_bytes} and quickjs.DISCARDS_RUNTIMES == {args.discard} and "
        f"quickjs.LAZY_ACCESSORS == {args.lazy_accessors} and quickjs.PROFILE_GUIDED == {args.pgo} and "
        "quickjs.Context().eval('6 * 7') == 42"
    )
    env = {**os.environ, "PYTHONPATH": str(args.target)} if args.target else None
    check = subprocess.run([sys.executable, "-c", probe], env=env, check=False)
    if installed(args.target) != wanted or check.returncode != 0:
        raise SystemExit(f"{PACKAGE} {wanted} did not install")
    print(f"{PACKAGE} {wanted} installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
