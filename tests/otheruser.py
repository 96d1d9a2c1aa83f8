"""Running this checkout's Python as another user (``nobody``, the pod's 65532), wherever the
checkout lives.

That user must reach the checkout (the editable install's source, and the virtualenv when it lives
inside) and the interpreter the virtualenv was made from, at their own paths: a virtualenv names
both by absolute path. Where a directory above one of them is closed to other users (root's home,
a CI workspace of mode 0700), the command runs in a private mount namespace in which that
directory is covered by an empty tmpfs and the needed trees are bound back at their paths. Nothing
outside the namespace changes. A needed tree that is itself closed to others cannot be reached that
way: ``closed_tree`` says so in one line, and the test fails with it.
"""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterable
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent

# A shell function: ``reach STAGE`` binds each of $REACH_PATHS (one a line) under STAGE (a
# directory of root's), covers each of $REACH_COVER with an empty tmpfs, then binds the paths back
# at their own places (their parents made anew, mode 0755). Run it as root in a mount namespace
# made private first. A path whose parent is replaced by a new tmpfs after the staging (the pod's
# /tmp) is bound back by calling ``reach_back STAGE`` after that.
REACH = r"""
reach() {
    IFS='
'
    umask 022
    for path in $REACH_PATHS; do mkdir -p "$1$path" && mount --bind "$path" "$1$path"; done
    for closed in $REACH_COVER; do mount -t tmpfs -o mode=0755 tmpfs "$closed"; done
    reach_back "$1"
    unset IFS
}
reach_back() {
    IFS='
'
    umask 022
    for path in $REACH_PATHS; do mkdir -p "$path" && mount --bind "$1$path" "$path"; done
    unset IFS
}
"""


def outermost(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without those inside another of them."""
    unique = sorted(set(paths))
    return [path for path in unique if not any(path != other and path.is_relative_to(other) for other in unique)]


def needed() -> list[Path]:
    """What the other user runs: this checkout, the virtualenv, the interpreter it was made from."""
    return outermost(Path(path).resolve() for path in (CHECKOUT, sys.prefix, sys.base_prefix))


def open_to_others(path: Path) -> bool:
    return stat.S_IMODE(path.stat().st_mode) & 0o005 == 0o005


def closed_above(paths: Iterable[Path]) -> list[Path]:
    """The outermost directories above ``paths`` that other users cannot enter or list."""
    return outermost(
        next(parent for parent in reversed(path.parents) if not open_to_others(parent))
        for path in paths
        if not all(open_to_others(parent) for parent in path.parents)
    )


def closed_tree(paths: Iterable[Path]) -> str | None:
    """Why another user cannot run from ``paths`` even with the directories above them covered."""
    for path in paths:
        for place in (path, *(path / part for part in ("bin", "lib", "execbox_runner"))):
            if place.exists() and not open_to_others(place):
                return f"{place} is closed to other users (mode {stat.S_IMODE(place.stat().st_mode):o}): clone with umask 022"
    return None


def environment(paths: list[Path], stage: Path) -> dict[str, str]:
    """What ``REACH`` reads, to make ``paths`` reachable staging them under ``stage``, which no
    cover may hide."""
    covers = closed_above(paths)
    assert not any(stage.is_relative_to(cover) for cover in covers), f"{stage} would be covered: {covers}"
    return {"REACH_PATHS": "\n".join(map(str, paths)), "REACH_COVER": "\n".join(map(str, covers))}
