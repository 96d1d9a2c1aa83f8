"""Who may use code mode over HTTP: the Host and Origin a request names, and its bearer token.

Whoever reaches the HTTP endpoint runs code against the wrapped servers' tools, with the
operator's credentials (their ``headers``, their environment). So the endpoint is closed by
default, in this order:

* ``Host`` must be one of the allowed hosts (``--allowed-hosts``; by default the loopback names and
  ``--host``, at any port), else 403: a web page that rebinds a name of its own to this address
  still names its own host.
* ``Origin``, which browsers send and other MCP clients do not, must be absent or allowed
  (``--allowed-origins``; none by default), else 403: a web page the user visits cannot use the
  endpoint.
* With tokens (``--http-token``, ``--http-token-file``, ``$EXECBOX_RUNNER_MCP_TOKEN``), exactly one
  ``Authorization: Bearer <token>`` header, compared in constant time with each token, else 401.
  A non-loopback address needs tokens, unless ``--allow-unauthenticated`` says otherwise (the
  command refuses to start without them, as ``serve`` does).

A pattern ``NAME:*`` allows ``NAME`` at any port; any other is compared exactly. This module imports
nothing of the MCP SDK: the command line checks the settings before the SDK is loaded, and the
check is a plain ASGI middleware (``Guard``).
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, TypeAlias

from ..exposure import is_loopback, read_tokens

TOKEN_ENV: Final = "EXECBOX_RUNNER_MCP_TOKEN"  # noqa: S105 -- the name of the variable, not a token
LOOPBACK_HOSTS: Final = ("127.0.0.1:*", "localhost:*", "[::1]:*")
_WILDCARDS: Final = frozenset({"0.0.0.0", "::", ""})  # noqa: S104 -- addresses recognised, not bound

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
App: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]


def split(listed: str) -> tuple[str, ...]:
    """The entries of a comma-separated list, without spaces or empty ones."""
    return tuple(entry.strip() for entry in listed.split(",") if entry.strip())


def default_hosts(host: str) -> tuple[str, ...]:
    """The Host values allowed unless listed: the loopback names, and the address served, if it is one
    address (for ``0.0.0.0`` or ``::``, the names clients use must be listed)."""
    if host in _WILDCARDS or is_loopback(host):
        return LOOPBACK_HOSTS
    return (*LOOPBACK_HOSTS, f"[{host}]:*" if ":" in host else f"{host}:*")


def matches(value: str, patterns: tuple[str, ...]) -> bool:
    """Whether ``value`` is one of ``patterns``, where ``NAME:*`` is ``NAME`` at any port or none."""
    return any(
        value == pattern or (pattern.endswith(":*") and (value == pattern[:-2] or value.startswith(pattern[:-1])))
        for pattern in patterns
    )


@dataclass(frozen=True)
class Access:
    """What a request needs to reach code mode (see the module docstring)."""

    hosts: tuple[str, ...]
    origins: tuple[str, ...] = ()
    tokens: tuple[bytes, ...] = ()

    def refusal(self, headers: list[tuple[str, str]]) -> tuple[int, str] | None:
        """The status and reason to refuse a request with these headers (names lower-case), or None."""
        hosts = [value for name, value in headers if name == "host"]
        if len(hosts) != 1 or not matches(hosts[0], self.hosts):
            return 403, f"Host {', '.join(hosts) or 'missing'} is not allowed (see --allowed-hosts)"
        origins = [value for name, value in headers if name == "origin"]
        if origins and (len(origins) > 1 or not matches(origins[0], self.origins)):
            return 403, f"Origin {', '.join(origins)} is not allowed (see --allowed-origins)"
        if self.tokens:
            authorizations = [value for name, value in headers if name == "authorization"]
            scheme, _, presented = authorizations[0].partition(" ") if len(authorizations) == 1 else ("", "", "")
            matched = False
            for token in self.tokens:  # every token compared, in constant time: no timing says which
                matched |= hmac.compare_digest(presented.strip().encode(), token)
            if scheme.lower() != "bearer" or not matched:
                return 401, "exactly one Authorization header with a valid bearer token is required"
        return None


class Guard:
    """ASGI middleware: HTTP requests that ``access`` refuses get their status and a JSON reason;
    the rest (and lifespan events) go to ``app``."""

    def __init__(self, app: App, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [(name.decode("latin-1").lower(), value.decode("latin-1")) for name, value in scope["headers"]]
        refused = self.access.refusal(headers)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, reason = refused
        body = json.dumps({"error": "unauthorized" if status == 401 else "forbidden", "message": reason}).encode()
        response = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            response.append((b"www-authenticate", b'Bearer realm="execbox-runner mcp"'))
        await send({"type": "http.response.start", "status": status, "headers": response})
        await send({"type": "http.response.body", "body": body})


def http_access(
    host: str, *, tokens: str, token_file: str, hosts: str, origins: str, allow_unauthenticated: bool
) -> Access:
    """What requests to code mode served on ``host`` need, from the command's options (``tokens`` from
    the flag or else the environment). Raises ValueError, in words for the command's one line,
    for a token file that cannot be read, and for a non-loopback ``host`` without tokens unless
    ``allow_unauthenticated``."""
    try:
        accepted = read_tokens(tokens or os.environ.get(TOKEN_ENV, ""), token_file)
    except OSError as exc:
        raise ValueError(f"cannot read --http-token-file {token_file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read --http-token-file {token_file}: not UTF-8 text") from None
    except ValueError as exc:
        raise ValueError(f"--http-token or --http-token-file: {exc}") from None
    if not accepted and not is_loopback(host) and not allow_unauthenticated:
        raise ValueError(
            f"refusing to serve {host} without authentication: give --http-token-file (or --http-token,"
            f" ${TOKEN_ENV}), or pass --allow-unauthenticated"
        )
    return Access(hosts=split(hosts) or default_hosts(host), origins=split(origins), tokens=accepted)
