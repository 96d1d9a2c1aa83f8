"""Build quickjs-ng with execbox-runner's patches and install it into this interpreter's environment.

This downloads the pinned quickjs-ng sdist from PyPI, checks its sha256, applies the patches named
in ``patches/series`` (each says in its header what it changes and why: smaller arenas, memory
budgets checked in C, the time limit's clock read lazily, runtimes discarded whole, accessors made
on first use, the budgets set and read through the binding, each size class's first arena half as
large), and builds it profile-guided: GCC instruments a first build, ``training.py`` runs
the runner's own workload on it, and the second build is laid out and inlined by those counts,
optimized at link time (a trivial execution's runtime costs ~20% less; two such builds are not
identical byte for byte, ``--no-pgo`` ones are). The version installed carries a local label
naming what it holds (``0.17.0.2+arena2048.first1024.budget2.clock.lazy.discard.pgo``). It needs GCC,
``patch``, the Python headers and the environment's execbox-runner (for the training), and takes
about two minutes. execbox-runner also runs on the PyPI wheel; ``execbox-runner info`` says which
build is in use.

Usage: ``.venv/bin/python deploy/quickjs/build.py [--arena-bytes 2048] [--no-discard] [--eager-accessors]
[--no-pgo] [--target DIR]`` (``--no-discard``, ``--eager-accessors`` or ``--no-pgo`` with ``--target
DIR`` builds one to measure against, for ``PYTHONPATH=DIR``).
"""

from __future__ import annotations

import argparse
import hashlib
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
VERSION = "0.17.0.2"  # the sdist the patches were written against
SDIST_SHA256 = "43d2e48272208721a7aaea8e3f02d4b9318f12ef20cc4f5421b59d9a470706ef"  # as PyPI lists it
PATCHES = Path(__file__).with_name("patches")
# The patches the options leave out (to measure against); every other one of the series is applied.
DISCARD_PATCH = "0004-discard-a-runtime-whole.patch"
LAZY_ACCESSORS_PATCH = "0005-accessors-made-on-first-use.patch"
# The arena sizes 0001 allows: a 512-byte block and the arena's header must fit; larger than 4096 only wastes more.
ARENA_CHOICES = (1024, 2048, 4096)


def label(arena_bytes: int, discard: bool = True, lazy_accessors: bool = True, pgo: bool = True) -> str:
    """The version the build installs as: PEP 440 ignores the local label when matching
    ``quickjs-ng>=0.17``, so the project's requirement still holds. ``budget2``: the budget is
    checked in C (0002) and set and read through the binding (0006); a build of 0002 alone was
    ``budget``, and an environment holding one is rebuilt. ``first``: each size class's first arena
    is half the size (0007); a build without it is rebuilt too."""
    return (
        f"{VERSION}+arena{arena_bytes}.first{first_arena_bytes(arena_bytes)}.budget2.clock"
        + (".lazy" if lazy_accessors else "")
        + (".discard" if discard else "")
        + (".pgo" if pgo else "")
    )


def first_arena_bytes(arena_bytes: int) -> int:
    """A size class's first arena in a build of ``arena_bytes`` arenas: half of them (0007's
    ``JS_ARENA_FIRST_SIZE``)."""
    return arena_bytes // 2


def series(discard: bool = True, lazy_accessors: bool = True) -> list[Path]:
    """The patches to apply, in order: ``patches/series`` less those the options leave out."""
    lines = (PATCHES / "series").read_text().splitlines()
    names = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    left_out = {DISCARD_PATCH: not discard, LAZY_ACCESSORS_PATCH: not lazy_accessors}
    return [PATCHES / name for name in names if not left_out.get(name, False)]


def verify(archive: Path) -> None:
    """Stop unless ``archive`` is the sdist the patches were written against."""
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{archive.name}: sha256 {digest}, not that of {PACKAGE} {VERSION}'s sdist ({SDIST_SHA256})")


def apply(tree: Path, patches: list[Path]) -> None:
    """Apply ``patches`` to ``tree`` in turn, each tried first (``--dry-run``) so that one that does
    not apply exactly (no fuzz) stops the build with the tree as the previous one left it."""
    run = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--no-backup-if-mismatch", "--silent", "-d", str(tree)]
    for path in patches:
        for attempt in (["--dry-run"], []):
            try:
                done = subprocess.run([*run, *attempt, "-i", str(path)], capture_output=True, text=True, check=False)
            except FileNotFoundError as exc:
                raise SystemExit("the build needs GNU patch on PATH") from exc
            if done.returncode != 0:
                raise SystemExit(f"{path.name} does not apply to {tree.name}:\n{done.stdout}{done.stderr}")


def configure(tree: Path, arena_bytes: int, discard: bool, lazy_accessors: bool, pgo: bool) -> None:
    """Say in the binding's module what the build holds (read by ``execbox_runner.worker.native``
    and ``execbox-runner info``), and label its version."""
    with (tree / "quickjs" / "__init__.py").open("a") as module:
        module.write(
            f"\n# Set by execbox-runner's deploy/quickjs/build.py.\nARENA_BYTES = {arena_bytes}\n"
            f"FIRST_ARENA_BYTES = {first_arena_bytes(arena_bytes)}\n"
            f"NATIVE_BUDGET = True\nLAZY_CLOCK = True\nDISCARDS_RUNTIMES = {discard}\nLAZY_ACCESSORS = {lazy_accessors}\n"
            f"PROFILE_GUIDED = {pgo}\n"
        )
    project = tree / "pyproject.toml"
    text, stock = project.read_text(), f'version = "{VERSION}"\n'
    if text.count(stock) != 1:
        raise SystemExit(f"{project}: no {stock.strip()!r}: not {PACKAGE} {VERSION}'s sdist")
    project.write_text(text.replace(stock, f'version = "{label(arena_bytes, discard, lazy_accessors, pgo)}"\n'))


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
# directly inside the library (QuickJS is a shared object no one interposes).
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


def install_trained(tree: Path, target: Path | None, scratch: Path, defines: tuple[str, ...]) -> None:
    """Build ``tree`` instrumented, run ``training.py`` on it, then build and install it laid out
    by the counts. The second build compiles the same objects at the same paths, so each finds
    its counts, and a unit without them fails the build (``-Werror=missing-profile``)."""
    profiles, trainee = scratch / "profiles", scratch / "trainee"
    generate = (f"-fprofile-generate={profiles}", "-fprofile-update=prefer-atomic")
    install(tree, trainee, with_flags((*defines, *OPTIMIZED, *generate)))
    print("training it on the runner's workload", flush=True)
    training = [sys.executable, str(TRAINING), "--rounds", str(TRAINING_ROUNDS)]
    subprocess.run(training, env=with_flags((), trainee), check=True, timeout=900)
    use = (f"-fprofile-use={profiles}", "-fprofile-partial-training", "-fprofile-correction", "-Werror=missing-profile")
    print("building it by the counts", flush=True)
    install(tree, target, with_flags((*defines, *OPTIMIZED, *use)))


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
    parser.add_argument("--no-discard", dest="discard", action="store_false", help=f"leave out {DISCARD_PATCH}")
    parser.add_argument(
        "--eager-accessors", dest="lazy_accessors", action="store_false", help=f"leave out {LAZY_ACCESSORS_PATCH}"
    )
    parser.add_argument("--no-pgo", dest="pgo", action="store_false", help="compile once, without a training run")
    parser.add_argument("--target", type=Path, help="install into this directory (for PYTHONPATH) instead")
    args = parser.parse_args()
    wanted = label(args.arena_bytes, args.discard, args.lazy_accessors, args.pgo)
    if installed(args.target) == wanted:
        print(f"{PACKAGE} {wanted} is installed already")
        return 0
    defines = (f"-DJS_ARENA_SIZE={args.arena_bytes}",)
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(scratch)
        pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}", "--dest", scratch)
        (archive,) = where.glob("*.tar.gz")
        verify(archive)
        extract(archive, where)
        tree = where / archive.name.removesuffix(".tar.gz")
        apply(tree, series(args.discard, args.lazy_accessors))
        configure(tree, args.arena_bytes, args.discard, args.lazy_accessors, args.pgo)
        print(f"building {PACKAGE} {wanted} (about {'two minutes' if args.pgo else 'a minute'})", flush=True)
        if args.pgo:
            try:
                install_trained(tree, args.target, where, defines)
            except subprocess.CalledProcessError as exc:
                raise SystemExit(
                    f"the profile-guided build failed ({exc}): it needs GCC, and execbox-runner installed in this "
                    "environment for the training; --no-pgo builds without a profile"
                ) from exc
        else:
            install(tree, args.target, with_flags(defines))
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
