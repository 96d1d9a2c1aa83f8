"""Daemon settings: one dataclass, with the CLI flag, environment variable and
TOML key of each, and the rule each value must follow.

Every setting is a ``--flag`` of ``execbox-runner serve``, an
``EXECBOX_RUNNER_<NAME>`` environment variable, and a key of the optional TOML
file given by ``--config`` (or ``EXECBOX_RUNNER_CONFIG``). Precedence: flag,
then environment variable, then file, then default.

All three sources go through one converter, so a value is never read one way
from a flag and another way from the file: numbers must be in range, booleans
are one of six words, choices are spelled out, files must exist. A value that
breaks its rule is an ``InvalidSetting`` naming where it came from; the CLI
prints that one line and exits 2, before anything starts.

``GROUPS`` orders the settings by topic and ``default_text`` words each
default, as ``serve --help`` shows them (and a reference page can too).
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sized
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from ..exposure import read_tokens
from .machine import usable_cores
from .tenants import read_tenants

ENV_PREFIX: Final = "EXECBOX_RUNNER_"
TRUE_WORDS: Final = ("true", "1", "yes")
FALSE_WORDS: Final = ("false", "0", "no")
MAX_PORT: Final = 65535
NOT_TEXT: Final = "not UTF-8 text"  # a file of settings or tokens that does not decode
PORTS: Final = frozenset({"port", "metrics_port"})
# Runner threads a worker may start: 64 times the default, well past the cores any machine runs
# guests on at once. Far more cannot start (16,384 each with its 32 MiB stack fail with "can't
# start new thread"), which left the daemon replacing workers forever, never ready.
MAX_WORKER_THREADS: Final = 1024
# Daemon processes of one supervisor: far more than the cores of any machine (each needs about two),
# and few enough that a mistyped count does not start a process per number.
MAX_PROCESSES: Final = 256
# Numbers with an upper bound besides the ports'.
MAXIMA: Final = {"worker_threads": MAX_WORKER_THREADS, "processes": MAX_PROCESSES}
# Numbers with a lower bound above 1: below it the daemon would start and answer every execution
# with the same failure. A message must hold an ``execute`` with its providers, an output a result of
# a few fields.
MINIMA: Final = {"max_message_bytes": 4096, "max_output_bytes": 1024}


@dataclass(frozen=True)
class Settings:
    profile: str = "standard"
    host: str = "127.0.0.1"
    port: int = 8765
    warm_workers: int = max(2, min(usable_cores(), 8))
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
    metrics_port: int = 0
    metrics_host: str = ""
    metrics_token: str = ""
    metrics_token_file: str = ""
    max_sessions: int = 0
    idle_timeout: float = 60.0
    drain_grace: float = 25.0
    sandbox: bool = True
    send_timeout: float = 10.0
    handshake_timeout: float = 10.0
    close_timeout: float = 2.0
    cancel_grace: float = 0.010
    timeout_grace: float = 0.020
    log_level: str = "INFO"
    log_format: str = "json"
    log_guest_code: bool = False
    record_dir: str = ""


class InvalidSetting(ValueError):
    """A value the daemon refuses to start with; the message is the one line an operator sees."""


CHOICES: Final[dict[str, tuple[str, ...]]] = {
    "profile": ("standard", "hardened"),
    "log_format": ("json", "text"),
    "log_level": ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
}
# Numbers that may be 0 (with the meaning their help gives); every other number must be above 0.
ZERO_ALLOWED: Final = frozenset(
    {
        "port",
        "metrics_port",
        "warm_workers",
        "max_executions_per_worker",
        "processes",
        "memory_budget_bytes",
        "max_sessions",
        "drain_grace",
        "cancel_grace",
        "timeout_grace",
    }
)
# Files that must exist when set; a missing one would otherwise fail later, or never.
EXISTING_FILES: Final = frozenset({"tokens_file", "certfile", "keyfile", "metrics_token_file"})
# Strings that may not be empty.
REQUIRED: Final = frozenset({"host"})
# Settings of comma-separated bearer tokens.
TOKEN_LISTS: Final = frozenset({"tokens", "metrics_token"})
# An Origin as a browser sends it (RFC 6454's serialization): lower case, no path, no default port.
ORIGIN: Final = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*)://(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(?::(?P<port>[0-9]{1,5}))?")
DEFAULT_PORTS: Final = {"http": "80", "https": "443"}

HELP: dict[str, str] = {
    "profile": "standard: confined worker processes each host up to --worker-capacity executions at once (a fresh QuickJS runtime each); hardened: a fresh confined process for every execution",
    "host": "address to listen on",
    "port": "TCP port to listen on (0 picks a free port)",
    "warm_workers": "worker processes kept started ahead of demand (0: none; at most --max-workers)",
    "max_workers": "most worker processes at once; further executions wait for room",
    "max_executions_per_worker": "executions after which a worker takes no more and is replaced (0: never)",
    "memory_budget_bytes": "resident memory the daemon, its zygote and workers may hold; at 90 percent of it new sessions get HTTP 503; 0: 80 percent of the cgroup limit or of the machine's memory",
    "processes": "daemon processes sharing the port (SO_REUSEPORT), each with its own workers and a share of the limits; 0: one per two usable cores, at least one",
    "worker_capacity": "most executions one worker process hosts at once (standard profile), each in its own QuickJS runtime",
    "worker_threads": "runner threads per worker: how many of its executions can run JavaScript at the same moment (parked ones need none)",
    "share_workers_across_tokens": "let executions authenticated with different tokens share worker processes (off: one set of workers per token)",
    "max_message_bytes": "largest WebSocket message accepted from a host (larger: close 1009)",
    "max_output_bytes": "largest result or tool input (JSON bytes) an execution may send; larger: serialization_error",
    "max_timeout_ms": "largest timeoutMs an execute may ask for; larger: done validation_error",
    "max_memory_limit_bytes": "largest memoryLimitBytes an execute may ask for; larger: done validation_error",
    "tokens_file": "existing file of accepted bearer tokens, one per line, each optionally with tenant=NAME, its quotas and its weight; sessions need 'Authorization: Bearer TOKEN' (else HTTP 401)",
    "tokens": "accepted bearer tokens, comma-separated (prefer the environment variable or --tokens-file)",
    "allow_unauthenticated": "serve a non-loopback address without tokens (refused otherwise)",
    "allowed_origins": "comma-separated Origin values allowed to open sessions; a handshake with any other Origin gets HTTP 403 (browsers send one, hosts do not)",
    "certfile": "existing TLS certificate chain (PEM): serve wss:// instead of ws://",
    "keyfile": "existing TLS private key (PEM), with --certfile",
    "metrics_port": "serve /metrics and the detailed /healthz on this port (over TLS with --certfile), not on --port, which then answers only /readyz and a bare /healthz for probes; 0: off, all on --port",
    "metrics_host": "address for --metrics-port; empty: --host's",
    "metrics_token": "bearer tokens, comma-separated, that /metrics and the detailed /healthz require (probes never do); prefer the environment variable or --metrics-token-file; empty: none required",
    "metrics_token_file": "existing file of metrics bearer tokens (as --metrics-token), one per line",
    "max_sessions": "most concurrent sessions (one execution each); beyond it handshakes get HTTP 503 with Retry-After; 0: sized from memory and descriptors (up to 20,000)",
    "idle_timeout": "seconds a session may go without an execution before it is closed (close code 1000)",
    "drain_grace": "on SIGTERM/SIGINT: seconds running executions get to finish before they are cancelled (0: cancel at once); a second signal stops at once",
    "sandbox": "confine workers (namespaces, rlimits, seccomp); 'false' only for debugging (reported as unsafe)",
    "send_timeout": "seconds a send to a host may block before the host is dropped",
    "handshake_timeout": "seconds a client has to complete the WebSocket handshake",
    "close_timeout": "seconds to wait for the host's half of the closing handshake",
    "cancel_grace": "seconds a cancelled worker has to hand over its last logs before done goes without them (hosts force-close 25 ms after cancel; 0: no wait)",
    "timeout_grace": "seconds a timed-out worker has to hand over its last logs; the worker ends the guest at the same deadline itself (hosts cancel 100 ms after timeoutMs; 0: no wait)",
    "log_level": "daemon log level; INFO logs one line per execution",
    "log_format": "json: one JSON object per line; text: human-readable",
    "record_dir": "write every session's transcript (JSONL, replayable with 'execbox-runner replay') and a summary here (created if missing)",
    "log_guest_code": "include guest code in execution log lines (never on by default)",
}


def rule(name: str, kind: type) -> str:
    """The rule a setting's values follow, as its help text and errors state it."""
    if name in CHOICES:
        return "one of " + ", ".join(CHOICES[name])
    if kind is bool:
        return "a boolean: " + "/".join(TRUE_WORDS + FALSE_WORDS)
    if name in PORTS:
        return f"a port number 0-{MAX_PORT}"
    if name == "allowed_origins":
        return "each SCHEME://HOST[:PORT] as browsers send it (lower case, no path or trailing /, no default port)"
    if kind in (int, float):
        number = "an integer" if kind is int else "a number of seconds"
        maximum = f" and <= {MAXIMA[name]}" if name in MAXIMA else ""
        if name in MINIMA:
            return f"{number} >= {MINIMA[name]}{maximum}"
        return f"{number} {'>= 0' if name in ZERO_ALLOWED else '> 0'}{maximum}"
    return ""


def convert(name: str, kind: type, value: object) -> object:
    """``value`` (text from a flag or variable, or a TOML value) as the setting's type.

    Raises ValueError saying what is wrong with it, without where it came from.
    """
    wanted = rule(name, kind)
    if kind is bool:
        if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
            return value.strip().lower() in TRUE_WORDS
        if isinstance(value, str):
            raise ValueError(f"must be {wanted}")
        if not isinstance(value, bool):  # a TOML value: its words above are strings, 1 a number
            raise ValueError("must be a TOML boolean: true or false")
        return value
    if kind in (int, float):
        number = _number(kind, value, wanted)
        too_small = number < 0 or (number == 0 and name not in ZERO_ALLOWED) or number < MINIMA.get(name, 0)
        maximum = MAX_PORT if name in PORTS else MAXIMA.get(name, math.inf)
        if too_small or number > maximum:
            raise ValueError(f"must be {wanted}")
        return number
    if not isinstance(value, str):
        raise ValueError(f"must be text, not {type(value).__name__}")
    if name in CHOICES:
        for choice in CHOICES[name]:
            if value.strip().lower() == choice.lower():
                return choice
        raise ValueError(f"must be {wanted}")
    if name in REQUIRED and not value.strip():
        raise ValueError("must not be empty")
    if name in TOKEN_LISTS:
        try:
            read_tokens(value, "")  # the rule the daemon reads them by
        except ValueError as exc:
            raise ValueError(f"holds a token no client could send ({exc})") from None
    if name == "allowed_origins":  # a listed value no browser sends would refuse every page silently
        for origin in filter(None, (item.strip() for item in value.split(","))):
            form = ORIGIN.fullmatch(origin)
            if form is None or form["port"] == DEFAULT_PORTS.get(form["scheme"]):
                raise ValueError(f"{origin!r} must be {wanted.removeprefix('each ')}")
    return value


# The files of tokens: how each is read, and what it would leave open without a token.
TOKEN_FILES: Final[dict[str, tuple[Callable[[str, str], Sized], str]]] = {
    "tokens_file": (read_tenants, "sessions open to anyone who reaches the port"),
    "metrics_token_file": (read_tokens, "/metrics open"),
}


def _path_problem(name: str, value: str) -> str | None:
    """What is wrong with a path setting's file, if anything (checked once the settings agree)."""
    path = Path(value)
    if name in EXISTING_FILES and value and not path.is_file():
        return os.strerror(errno.ENOENT) if not path.exists() else "not a regular file"
    if name in TOKEN_FILES and value:
        read, empty = TOKEN_FILES[name]
        try:
            if not read("", value):
                return f"holds no token (it would leave {empty})"
        except UnicodeDecodeError:
            return NOT_TEXT
        except ValueError as exc:
            return str(exc)
        except OSError as exc:
            return exc.strerror or str(exc)
    if name == "record_dir" and value and path.exists() and not path.is_dir():
        return "exists and is not a directory"
    return None


def _number(kind: type, value: object, wanted: str) -> int | float:
    """An int or a finite float from text or a TOML number (never from a TOML boolean)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"must be {wanted}")
    if isinstance(value, float) and kind is int:
        raise ValueError(f"must be {wanted}")
    try:
        number: int | float = kind(value.strip()) if isinstance(value, str) else kind(value)
    except ValueError:
        raise ValueError(f"must be {wanted}") from None
    if not math.isfinite(number):
        raise ValueError(f"must be {wanted}")
    return number


# The settings by topic, in the order ``serve --help`` lists them: each setting exactly once.
GROUPS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("Listening and TLS", ("host", "port", "certfile", "keyfile")),
    ("Authentication", ("tokens_file", "tokens", "allow_unauthenticated", "allowed_origins")),
    (
        "Limits",
        (
            "max_sessions",
            "max_timeout_ms",
            "max_memory_limit_bytes",
            "memory_budget_bytes",
            "max_message_bytes",
            "max_output_bytes",
        ),
    ),
    (
        "Workers and isolation",
        (
            "profile",
            "sandbox",
            "processes",
            "warm_workers",
            "max_workers",
            "worker_capacity",
            "worker_threads",
            "max_executions_per_worker",
            "share_workers_across_tokens",
        ),
    ),
    (
        "Timeouts",
        (
            "idle_timeout",
            "handshake_timeout",
            "send_timeout",
            "close_timeout",
            "drain_grace",
            "cancel_grace",
            "timeout_grace",
        ),
    ),
    ("Metrics and health", ("metrics_port", "metrics_host", "metrics_token", "metrics_token_file")),
    ("Logs and records", ("log_level", "log_format", "log_guest_code", "record_dir")),
)
# Defaults that a value would not explain: sized from the machine, or empty with a meaning.
DEFAULT_WORDS: Final = {
    "warm_workers": "the usable cores, 2 to 8",
    "allowed_origins": "empty (no Origin)",
    "metrics_host": "empty (--host's)",
}


def default_text(name: str) -> str:
    """The default of setting ``name`` as ``--help`` shows it: booleans as the words the flags
    take, an empty value as "none", sizes in bytes with their MiB, times with their unit."""
    if name in DEFAULT_WORDS:
        return DEFAULT_WORDS[name]
    value = {field.name: field.default for field in fields(Settings)}[name]
    if isinstance(value, bool):
        return TRUE_WORDS[0] if value else FALSE_WORDS[0]
    if value == "":
        return "none"
    if isinstance(value, float):
        return f"{value:g} s"
    if isinstance(value, int) and name.endswith("_bytes") and value >= 2**20:
        return f"{value} ({value / 2**20:g} MiB)"
    if isinstance(value, int) and name.endswith("_ms") and value >= 1000:
        return f"{value} ({value / 1000:g} s)"
    return str(value)


def _metavar(name: str, kind: type) -> str:
    """What a flag takes, in a word: the choices, or the kind of value."""
    if name in CHOICES:
        return "{" + ",".join(CHOICES[name]) + "}"
    if kind is bool:
        return "BOOL"
    if name in PORTS:
        return "PORT"
    if name in EXISTING_FILES:
        return "FILE"
    for suffix, word in (
        ("_bytes", "BYTES"),
        ("_ms", "MS"),
        ("_dir", "DIR"),
        ("host", "HOST"),
        ("_origins", "ORIGINS"),
    ):
        if name.endswith(suffix):
            return word
    if kind is float:
        return "SECONDS"
    return "N" if kind is int else "TOKENS"  # the tokens and metrics_token: the other text settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per setting, read as text (``resolve`` converts flags, variables and keys alike),
    in the argument groups of ``GROUPS``; each help has a second line: the rule, default and
    variable (``HelpFormatter`` keeps it a line of its own)."""
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="existing TOML file of settings (keys as the flags without --, e.g. max_sessions = 64); flags and"
        f" environment variables win over it (env {ENV_PREFIX}CONFIG)",
    )
    kinds = {field.name: type(field.default) for field in fields(Settings)}
    for title, names in GROUPS:
        group = parser.add_argument_group(title)
        for name in names:
            facts = (rule(name, kinds[name]), f"default: {default_text(name)}", f"env {ENV_PREFIX + name.upper()}")
            group.add_argument(
                "--" + name.replace("_", "-"),
                dest=name,
                default=None,
                metavar=_metavar(name, kinds[name]),
                help=f"{HELP[name]}\n{'; '.join(filter(None, facts))}".replace("%", "%%"),
            )


def _from_file(path: str, origins: dict[str, str]) -> dict[str, Any]:
    """The settings of a TOML file, converted; unknown keys are refused. Records where each came from in ``origins``."""
    try:
        table = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidSetting(f"cannot read config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidSetting(f"cannot read config file {path}: {NOT_TEXT}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InvalidSetting(f"cannot read config file {path}: {exc}") from None
    known = {field.name: type(field.default) for field in fields(Settings)}
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}  # each setting's key in the file
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            raise InvalidSetting(f"config file {path}: unknown setting {key!r}")
        if name in keys:  # max-sessions and max_sessions: which one was meant is not for the runner to guess
            raise InvalidSetting(f"config file {path}: {keys[name]!r} and {key!r} are one setting, given twice")
        keys[name] = key
        origins[name] = f"config file {path}: {key} ="
        try:
            values[name] = convert(name, known[name], value)
        except ValueError as exc:
            raise InvalidSetting(f"{origins[name]} {shown(name, value)}: {exc}") from None
    return values


def shown(name: str, value: object) -> str:
    """A setting's value as an error quotes it: tokens never (errors reach logs and terminals)."""
    return "(tokens not shown)" if name in TOKEN_LISTS else repr(value)


def resolve(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Settings from flags, then environment variables, then the TOML file, then defaults.

    Raises InvalidSetting for the first value that breaks its rule, or settings that
    contradict each other.
    """
    if environ is None:
        environ = os.environ
    config_file = getattr(args, "config", None) or environ.get(ENV_PREFIX + "CONFIG")
    origins: dict[str, str] = {}  # setting -> where its value came from, for errors
    values: dict[str, Any] = _from_file(config_file, origins) if config_file else {}
    for field in fields(Settings):
        flag = getattr(args, field.name, None)
        env_name = ENV_PREFIX + field.name.upper()
        if flag is not None:
            source, given = "--" + field.name.replace("_", "-"), flag
        elif env_name in environ:
            source, given = env_name, environ[env_name]
        else:
            continue
        origins[field.name] = f"invalid {source}"
        try:
            values[field.name] = convert(field.name, type(field.default), given)
        except ValueError as exc:
            raise InvalidSetting(f"{origins[field.name]} {shown(field.name, given)}: {exc}") from None
    if "warm_workers" not in values:  # the machine-sized default never exceeds a lower --max-workers
        values["warm_workers"] = min(Settings.warm_workers, values.get("max_workers", Settings.max_workers))
    settings = Settings(**values)
    _check_together(settings)
    for name, origin in origins.items():
        problem = _path_problem(name, values[name]) if isinstance(values[name], str) else None
        if problem:
            raise InvalidSetting(f"{origin} {shown(name, values[name])}: {problem}")
    if settings.tokens:  # each right alone; together, every token given once
        try:
            read_tenants(settings.tokens, settings.tokens_file)
        except ValueError as exc:
            raise InvalidSetting(f"{origins['tokens']} {shown('tokens', settings.tokens)}: {exc}") from None
    return settings


# EXECBOX_RUNNER_* variables that are not settings but are read elsewhere: the config file, a
# shard's place (the supervisor), the image's health check, and the clients' and code mode's.
_OTHER_VARIABLES: Final = frozenset({"CONFIG", "SHARD", "OWNER", "HEALTHCHECK_PORT", "URL", "MCP_TOKEN"})


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each ``EXECBOX_RUNNER_*`` variable that nothing reads (a misspelt setting goes
    unnoticed otherwise), and for the clients' ``EXECBOX_RUNNER_TOKEN``, which is not a daemon's."""
    names = {ENV_PREFIX + field.name.upper() for field in fields(Settings)}
    names |= {ENV_PREFIX + name for name in _OTHER_VARIABLES}
    warnings = []
    for variable in sorted(os.environ if environ is None else environ):
        if variable == ENV_PREFIX + "TOKEN":
            warnings.append(
                f"{variable} is the clients' token and is not read here: the daemon's tokens are"
                f" {ENV_PREFIX}TOKENS or {ENV_PREFIX}TOKENS_FILE (--tokens, --tokens-file)"
            )
        elif variable.startswith(ENV_PREFIX) and variable not in names:
            warnings.append(f"{variable} is not a setting and is not read (see execbox-runner serve --help)")
    return warnings


def _check_together(settings: Settings) -> None:
    """Settings that are each valid but contradict each other."""
    if settings.keyfile and not settings.certfile:
        raise InvalidSetting("--keyfile needs --certfile")
    if settings.metrics_host and not settings.metrics_port:
        raise InvalidSetting("--metrics-host needs --metrics-port")
    if settings.metrics_port and settings.metrics_port == settings.port:
        raise InvalidSetting(f"--metrics-port {settings.metrics_port} is --port too: they must differ")
    if settings.warm_workers > settings.max_workers:
        raise InvalidSetting(f"--warm-workers {settings.warm_workers} exceeds --max-workers {settings.max_workers}")
