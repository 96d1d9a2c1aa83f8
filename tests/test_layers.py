"""The architecture as a rule: daemon -> protocol <- worker, and the protocol does no I/O.

Each check imports in a fresh interpreter, so what one test imported cannot
hide what another module pulls in.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "execbox_runner"
# What the pure protocol layer must never load, directly or through a dependency.
IO_MODULES = (
    "trio",
    "socket",
    "subprocess",
    "threading",
    "asyncio",
    "websockets",
    "quickjs",
    "execbox_runner.daemon",
    "execbox_runner.worker",
)


def loaded_by(module: str) -> set[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    "module",
    [
        "execbox_runner.protocol.messages",
        "execbox_runner.protocol.session",
        "execbox_runner.protocol.ipc",
        "execbox_runner.protocol.schema",
    ],
)
def test_protocol_loads_no_io(module: str) -> None:
    loaded = loaded_by(module)
    assert not {name for name in loaded for banned in IO_MODULES if name == banned or name.startswith(banned + ".")}


def imported_names(source: str, package: str) -> set[str]:
    """Absolute names of every module (and imported name) a module of ``package`` imports."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return names


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("worker", "execbox_runner.daemon"),
        ("protocol", "execbox_runner.daemon"),
        ("protocol", "execbox_runner.worker"),
        ("client", "execbox_runner.daemon"),  # the client talks to a daemon over the wire only
        ("client", "execbox_runner.worker"),
        ("mcp", "execbox_runner.daemon"),  # code mode is built on the client only
        ("mcp", "execbox_runner.worker"),
        ("daemon", "execbox_runner.client"),  # the command line that joins them is execbox_runner.cli
        ("daemon", "execbox_runner.mcp"),
        ("daemon", "execbox_runner_conformance"),
    ],
)
def test_layer_never_imports(layer: str, forbidden: str) -> None:
    for path in (PACKAGE / layer).rglob("*.py"):
        package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
        bad = {
            name
            for name in imported_names(path.read_text(), package)
            if name == forbidden or name.startswith(forbidden + ".")
        }
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_scan_resolves_relative_imports() -> None:
    """``from ..daemon import pool`` in the worker is seen as ``execbox_runner.daemon.pool``."""
    names = imported_names("from ..daemon import pool\nfrom . import native\nimport trio", "execbox_runner.worker")
    assert {"execbox_runner.daemon", "execbox_runner.daemon.pool", "execbox_runner.worker.native", "trio"} <= names


# What each part of the daemon may import of the rest of the daemon: the socket path knows nothing of
# the protocol's rules, the workers or what is reported; what is reported knows nothing of sockets or
# workers; the pool drives workers' channels through the reactor. The core (server, connection,
# config, cli, ...) ties them together.
DAEMON_PARTS = {
    "net": {"execbox_runner.daemon.net"},
    "observability": {"execbox_runner.daemon.observability"},
    "pool": {"execbox_runner.daemon.pool", "execbox_runner.daemon.net.reactor", "execbox_runner.daemon.machine"},
}


@pytest.mark.parametrize("part", sorted(DAEMON_PARTS))
def test_each_part_of_the_daemon_imports_only_what_it_may(part: str) -> None:
    allowed = DAEMON_PARTS[part]
    for path in (PACKAGE / "daemon" / part).rglob("*.py"):
        package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
        bad = {
            name
            for name in imported_names(path.read_text(), package)
            if name.startswith("execbox_runner.daemon.")
            and not any(name == ok or name.startswith(ok + ".") for ok in allowed)
        }
        assert not bad, f"daemon/{part}/{path.name} imports {sorted(bad)}"


def test_the_net_part_knows_no_protocol_rules() -> None:
    for path in (PACKAGE / "daemon" / "net").rglob("*.py"):
        package = ".".join(path.relative_to(PACKAGE.parent).parts[:-1])
        assert not {n for n in imported_names(path.read_text(), package) if n.startswith("execbox_runner.protocol")}
