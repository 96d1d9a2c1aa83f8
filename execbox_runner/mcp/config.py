"""The wrapped servers, in the JSON shape MCP clients already use for their server lists.

    {"mcpServers": {"files": {"command": "npx", "args": ["-y", "server-files", "."], "env": {}},
                    "search": {"url": "https://search.example/mcp", "headers": {"Authorization": "Bearer ..."}}}}

A ``command`` is started over stdio, a ``url`` is reached over streamable
HTTP. Each name becomes a guest namespace (sanitized like tool names). ``approve`` lists the
server's tools (by their MCP names; ``true`` for all) whose every call the user must approve, asked
through MCP elicitation while the program waits.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import msgspec

from ..client import safe_name


class UpstreamServer(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One wrapped MCP server: a ``command`` to run (stdio) or a ``url`` (streamable HTTP)."""

    command: str | None = None
    args: list[str] = msgspec.field(default_factory=list)
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    type: str | None = None  # "stdio" or "http", as some clients write it; implied by command/url here
    approve: list[str] | bool = False  # tools whose calls the user approves (True: all of them)

    def __post_init__(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either `command` (stdio) or `url` (streamable HTTP)")


class ServersConfig(msgspec.Struct, frozen=True):
    mcpServers: dict[str, UpstreamServer]  # the key MCP clients use


def load_servers(path: str | Path) -> dict[str, UpstreamServer]:
    """The servers of a config file; a bad file raises ``ValueError`` naming what is wrong."""
    try:
        servers = msgspec.json.decode(Path(path).read_bytes(), type=ServersConfig).mcpServers
        guest_namespaces(servers)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except (msgspec.DecodeError, ValueError) as exc:  # DecodeError includes ValidationError and the checks above
        raise ValueError(f"invalid server list {path}: {exc}") from None
    return servers


def guest_namespaces(names: Iterable[str]) -> dict[str, str]:
    """The guest namespace of each server name (sanitized like tool names); ``ValueError`` for two
    names that would be the same namespace, one of which would hide the other."""
    namespaces: dict[str, str] = {}
    for name in names:
        namespace = safe_name(name)
        other = next((seen for seen, taken in namespaces.items() if taken == namespace), None)
        if other is not None:
            raise ValueError(f"servers {other!r} and {name!r} are both the guest namespace {namespace}; rename one")
        namespaces[name] = namespace
    return namespaces
