"""Daemon settings: one dataclass, with the CLI flag, environment variable and
TOML key of each.

Every setting is a ``--flag`` of ``execbox-runner serve``, an
``EXECBOX_RUNNER_<NAME>`` environment variable, and a key of the optional TOML
file given by ``--config`` (or ``EXECBOX_RUNNER_CONFIG``). Precedence: flag,
then environment variable, then file, then default.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

ENV_PREFIX = "EXECBOX_RUNNER_"


@dataclass(frozen=True)
class Settings:
    profile: str = "standard"
    host: str = "127.0.0.1"
    port: int = 8765
    warm_workers: int = max(2, min(os.cpu_count() or 2, 8))
    max_workers: int = 64
    max_executions_per_worker: int = 100_000
    processes: int = 0
    memory_budget_bytes: int = 0
    worker_capacity: int = 2048
    worker_threads: int = 16
    share_workers_across_tokens: bool = False
    max_message_bytes: int = 16 * 1024 * 1024
    max_output_bytes: int = 16 * 1024 * 1024
    max_timeout_ms: int = 300_000
    max_memory_limit_bytes: int = 512 * 1024 * 1024
    tokens_file: str = ""
    tokens: str = ""
    allow_unauthenticated: bool = False
    allowed_origins: str = ""
    certfile: str = ""
    keyfile: str = ""
    max_sessions: int = 0
    idle_timeout: float = 60.0
    drain_grace: float = 25.0
    sandbox: bool = True
    send_timeout: float = 10.0
    handshake_timeout: float = 10.0
    close_timeout: float = 2.0
    cancel_grace: float = 0.010
    timeout_grace: float = 0.050
    log_level: str = "INFO"
    log_format: str = "json"
    log_guest_code: bool = False
    record_dir: str = ""


CHOICES: dict[str, tuple[str, ...]] = {"profile": ("standard", "hardened"), "log_format": ("json", "text")}

HELP: dict[str, str] = {
    "profile": "standard: confined worker processes each host up to --worker-capacity executions at once (a fresh QuickJS runtime each); hardened: a fresh confined process for every execution",
    "host": "address to listen on",
    "port": "TCP port to listen on (0 picks a free port)",
    "warm_workers": "worker processes kept started ahead of demand",
    "max_workers": "most worker processes at once; further executions wait for room",
    "max_executions_per_worker": "executions after which a worker takes no more and is replaced (0: never)",
    "memory_budget_bytes": "resident memory the daemon, its zygote and workers may hold; at 90 percent of it new sessions get HTTP 503; 0: 80 percent of the cgroup limit or of the machine's memory",
    "processes": "daemon processes sharing the port (SO_REUSEPORT), each with its own workers and a share of the limits; 0: one per core",
    "worker_capacity": "most executions one worker process hosts at once (standard profile), each in its own QuickJS runtime",
    "worker_threads": "runner threads per worker: how many of its executions can run JavaScript at the same moment (parked ones need none)",
    "share_workers_across_tokens": "let executions authenticated with different tokens share worker processes (off: one set of workers per token)",
    "max_message_bytes": "largest WebSocket message accepted from a host (larger: close 1009)",
    "max_output_bytes": "largest result or tool input (JSON bytes) an execution may send; larger: serialization_error",
    "max_timeout_ms": "largest timeoutMs an execute may ask for; larger: done validation_error",
    "max_memory_limit_bytes": "largest memoryLimitBytes an execute may ask for; larger: done validation_error",
    "tokens_file": "file of accepted bearer tokens, one per line; sessions need 'Authorization: Bearer TOKEN' (else HTTP 401)",
    "tokens": "accepted bearer tokens, comma-separated (prefer the environment variable or --tokens-file)",
    "allow_unauthenticated": "serve a non-loopback address without tokens (refused otherwise)",
    "allowed_origins": "comma-separated Origin values allowed to open sessions (else HTTP 403); empty: any",
    "certfile": "TLS certificate chain (PEM): serve wss:// instead of ws://",
    "keyfile": "TLS private key (PEM), with --certfile",
    "max_sessions": "most concurrent sessions (one execution each); beyond it handshakes get HTTP 503 with Retry-After; 0: sized from memory and descriptors (up to 20,000)",
    "idle_timeout": "seconds a session may go without an execution before it is closed (1000)",
    "drain_grace": "on SIGTERM/SIGINT: seconds running executions get to finish before they are cancelled",
    "sandbox": "confine workers (namespaces, rlimits, seccomp); 'false' only for debugging",
    "send_timeout": "seconds a send to a host may block before the host is dropped",
    "handshake_timeout": "seconds a client has to complete the WebSocket handshake",
    "close_timeout": "seconds to wait for the host's half of the closing handshake",
    "cancel_grace": "seconds a cancelled worker has to hand over its last logs before done goes without them (hosts force-close 25 ms after cancel)",
    "timeout_grace": "seconds a timed-out worker has to hand over its last logs (hosts cancel 100 ms after timeoutMs)",
    "log_level": "daemon log level (DEBUG, INFO, WARNING, ERROR); INFO logs one line per execution",
    "log_format": "json: one JSON object per line; text: human-readable",
    "record_dir": "write every session's transcript (JSONL, replayable with 'execbox-runner replay') and a summary here",
    "log_guest_code": "include guest code in execution log lines (never on by default)",
}


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"TOML file of settings (keys as below, e.g. max_sessions = 64); flags and environment variables win over it (env {ENV_PREFIX}CONFIG)",
    )
    for field in fields(Settings):
        env = ENV_PREFIX + field.name.upper()
        kind = _parse_bool if isinstance(field.default, bool) else type(field.default)
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest=field.name,
            type=kind,
            default=None,
            metavar=field.name.upper(),
            choices=CHOICES.get(field.name),
            help=f"{HELP[field.name]} (env {env}; default {field.default})",
        )


def _from_file(path: str) -> dict[str, Any]:
    """The settings of a TOML file, type-checked; unknown keys are refused."""
    try:
        table = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SystemExit(f"cannot read config file {path}: {exc}") from None
    known = {field.name: field for field in fields(Settings)}
    values: dict[str, Any] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            raise SystemExit(f"config file {path}: unknown setting {key!r}")
        kind = type(known[name].default)
        given = float(value) if kind is float and isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(given, kind) or (kind is int and isinstance(given, bool)):
            raise SystemExit(f"config file {path}: {key} must be {kind.__name__}, not {type(given).__name__}")
        if name in CHOICES and value not in CHOICES[name]:
            raise SystemExit(f"config file {path}: {key} must be one of {', '.join(CHOICES[name])}")
        values[name] = value
    return values


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from flags, then environment variables, then the TOML file, then defaults."""
    if environ is None:
        environ = os.environ
    config_file = getattr(args, "config", None) or environ.get(ENV_PREFIX + "CONFIG")
    values: dict[str, Any] = _from_file(config_file) if config_file else {}
    for field in fields(Settings):
        flag = getattr(args, field.name, None)
        if flag is not None:
            values[field.name] = flag
            continue
        env = environ.get(ENV_PREFIX + field.name.upper())
        if env is not None:
            try:
                parse: Callable[[str], object] = _parse_bool if isinstance(field.default, bool) else type(field.default)
                values[field.name] = parse(env)
            except ValueError:
                raise SystemExit(f"invalid {ENV_PREFIX + field.name.upper()}: {env!r}") from None
            if field.name in CHOICES and values[field.name] not in CHOICES[field.name]:
                raise SystemExit(
                    f"invalid {ENV_PREFIX + field.name.upper()}: {env!r} (choose from {', '.join(CHOICES[field.name])})"
                )
    return Settings(**values)
