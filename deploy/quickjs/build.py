"""Build quickjs-ng with smaller allocator arenas and install it into this interpreter's environment.

QuickJS-ng serves small allocations from 4 KiB arenas, one or more per size class (31 of
them), so a fresh runtime holds ~69 KiB of arena space it has not used yet. Every parked
execution is a runtime: with 2 KiB arenas each costs ~44 KiB less (README, "Memory"). The
arena size is a compile-time constant, so this downloads the pinned quickjs-ng sdist from
PyPI, sets the constant, labels the version (``0.17.0.2+arena2048``) and installs it with pip.
It needs a C compiler and the Python headers, and takes about a minute. execbox-runner also
runs on the PyPI wheel; ``execbox-runner info`` says which build is in use.

Usage: ``.venv/bin/python deploy/quickjs/build.py [--arena-bytes 2048]``
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "quickjs-ng"
VERSION = "0.17.0.2"  # the sdist the edits below were written against
ARENA_LINE = "#define JS_ARENA_SIZE              4096\n"
# A 512-byte block (the largest size class) and the arena's 40-byte header must fit;
# larger than the stock 4096 only wastes more.
ARENA_CHOICES = (1024, 2048, 4096)


def label(arena_bytes: int) -> str:
    """The version the build installs as: PEP 440 ignores the local label when matching
    ``quickjs-ng>=0.17``, so the project's requirement still holds."""
    return f"{VERSION}+arena{arena_bytes}"


def edit_once(text: str, old: str, new: str, where: str) -> str:
    """``text`` with its one ``old`` replaced; anything else means the sdist is not the one expected."""
    found = text.count(old)
    if found != 1:
        raise SystemExit(f"{where}: expected one {old.strip()!r}, found {found}: not quickjs-ng {VERSION}'s sdist")
    return text.replace(old, new)


def patch(tree: Path, arena_bytes: int) -> None:
    source = tree / "upstream-quickjs" / "quickjs.c"
    source.write_text(
        edit_once(source.read_text(), ARENA_LINE, ARENA_LINE.replace("4096", str(arena_bytes)), str(source))
    )
    module = tree / "quickjs" / "__init__.py"
    with module.open("a") as text:  # read by execbox_runner.worker.native
        text.write(f"\n# Set by execbox-runner's deploy/quickjs/build.py.\nARENA_BYTES = {arena_bytes}\n")
    project = tree / "pyproject.toml"
    project.write_text(
        edit_once(project.read_text(), f'version = "{VERSION}"\n', f'version = "{label(arena_bytes)}"\n', str(project))
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


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def installed() -> str | None:
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arena-bytes", type=int, choices=ARENA_CHOICES, default=2048)
    args = parser.parse_args()
    wanted = label(args.arena_bytes)
    if installed() == wanted:
        print(f"{PACKAGE} {wanted} is installed already")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        where = Path(scratch)
        pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", f"{PACKAGE}=={VERSION}", "--dest", scratch)
        (archive,) = where.glob("*.tar.gz")
        extract(archive, where)
        tree = where / archive.name.removesuffix(".tar.gz")
        patch(tree, args.arena_bytes)
        print(f"building {PACKAGE} {wanted} (about a minute)", flush=True)
        pip("install", "--quiet", "--no-deps", "--force-reinstall", str(tree))
    probe = (
        f"import quickjs; assert quickjs.ARENA_BYTES == {args.arena_bytes} and quickjs.Context().eval('6 * 7') == 42"
    )
    check = subprocess.run([sys.executable, "-c", probe], check=False)
    if installed() != wanted or check.returncode != 0:
        raise SystemExit(f"{PACKAGE} {wanted} did not install")
    print(f"{PACKAGE} {wanted} installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
