"""What the daemon enforces and allows with given settings on this host: the host report (``info``,
``/healthz``, the start-up warnings) and the values derived from the settings that the daemon,
its workers and the report share. Nothing here starts anything: each is computed from the
settings and the machine.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
from dataclasses import asdict
from typing import Final, TypedDict

from .. import __version__
from ..exposure import is_loopback
from ..worker import memory_limit, native, sandbox
from .config import Settings
from .machine import (
    RESERVED_FDS,
    default_max_sessions,
    default_memory_budget,
    default_processes,
    memory_bytes,
    raise_open_files,
    usable_cores,
)
from .startup import engine
from .supervisor import is_shard, shard_count
from .tenants import Tenant, read_tenants


class QuickJSReport(TypedDict):
    """The engine in use and what its build changes."""

    version: str
    tuned: bool
    arena_bytes: int
    first_arena_bytes: int
    discards_runtimes: bool
    lazy_accessors: bool
    lazy_clock: bool
    profile_guided: bool
    budget_in_c: bool


class TimeoutsReport(TypedDict):
    idle: float
    handshake: float
    send: float
    close: float
    drain_grace: float


class HostReport(TypedDict):
    """``host_report``: the JSON of ``info --json`` and of the detailed ``/healthz``'s host part."""

    version: str
    python: str
    machine: str
    profile: str
    engine: str
    interrupt_running_guests: bool
    hold_running_guests: bool
    quickjs: QuickJSReport
    protections: dict[str, dict[str, bool]]
    network_mechanism: str
    warnings: list[str]
    unsafe_settings: list[str]
    limits: dict[str, int]
    timeouts_s: TimeoutsReport
    memory_bytes: int
    memory_budget_bytes: int


# CPU time a hardened worker may use beyond the largest execution budget before the kernel stops it.
HARDENED_CPU_SLACK_S = 5
STANDARD_CPU_LIFETIME_S = 24 * 3600


# Settings that leave a runner open to more than its hosts: each one is a start-up warning, a name
# in ``unsafe_settings`` (``info``, ``/healthz``) and ``execbox_unsafe_settings{setting}`` 1, so a
# mis-deployed runner shows on a dashboard rather than only in a log nobody reads.
UNSAFE_SETTINGS: Final = {
    "sandbox_off": "workers are not confined (--sandbox false): guest code that escapes QuickJS has the daemon's user, files and network",
    "no_authentication": "no bearer tokens (--tokens-file, --tokens): anyone who reaches the port can run code",
    "no_tls": "a non-loopback address without TLS (--certfile): code, results and tokens cross the network in clear text",
    "no_network_namespace": "workers cannot get a network namespace on this host: guest code that escapes QuickJS can reach the network",
}


def unsafe_settings(
    settings: Settings, tokens: tuple[bytes, ...], protections: dict[str, dict[str, bool]]
) -> list[str]:
    """The names (keys of ``UNSAFE_SETTINGS``) that apply to these settings on this host."""
    namespace = protections["network_namespace"]
    applies = {
        "sandbox_off": not settings.sandbox,
        "no_authentication": not tokens,
        "no_tls": not settings.certfile and not is_loopback(settings.host),
        "no_network_namespace": namespace["requested"] and not namespace["enforced"],
    }
    return [name for name in UNSAFE_SETTINGS if applies[name]]


def shares_cpu(settings: Settings) -> bool:
    """Whether the pool shares the CPU between tenants by their weights: it needs each tenant's
    own workers, of the standard profile (a worker running many guests, some of them held back)."""
    return not settings.share_workers_across_tokens and settings.profile != "hardened"


def tenant_warnings(settings: Settings, tenants: tuple[tuple[bytes, Tenant], ...]) -> list[str]:
    """One sentence for each setting of the tokens file that these settings leave without effect,
    so that an operator learns it at start rather than from a tenant that was never held back."""
    found = []
    for tenant in {tenant.name: tenant for _, tenant in tenants}.values():
        if tenant.cpu_seconds_per_minute is not None and settings.share_workers_across_tokens:
            found.append(
                f"tenant {tenant.name}'s cpu_seconds_per_minute counts nothing with --share-workers-across-tokens true:"
                " its guests' CPU is not told apart from other tenants'"
            )
        if tenant.weight != 1 and not shares_cpu(settings):
            found.append(
                f"tenant {tenant.name}'s weight has no effect: fair shares need tenants' own workers"
                " of the standard profile (not --share-workers-across-tokens true, not --profile hardened)"
            )
    return found


def descriptor_warnings(settings: Settings) -> list[str]:
    """A sentence when a stated ``--max-sessions`` is more than a daemon process's descriptor
    limit carries (each session is a socket; the default is sized to fit): past it, connections
    are shed, while ``execbox_max_sessions``, the alerts and the autoscaler count on the setting."""
    if not settings.max_sessions:
        return []
    processes = 1 if is_shard() else settings.processes or default_processes(usable_cores())
    share = math.ceil(settings.max_sessions / processes)  # a shard's setting is its share already
    limit = raise_open_files()
    if share <= limit - RESERVED_FDS:
        return []
    return [
        f"--max-sessions is more than the descriptor limit carries: {share} sessions a daemon process, against"
        f" {limit} descriptors; raise the limit (LimitNOFILE, the runtime's nofile) to {share + RESERVED_FDS}"
        " or more, or connections past it are shed"
    ]


def host_report(settings: Settings) -> HostReport:
    """What the daemon enforces here with these settings (``info``, ``/healthz``, start-up warnings)."""
    found = sandbox.capabilities()  # one probe (a forked child) for both reports below
    protections = sandbox.enforcement(settings.sandbox, found)
    tenants = accepted_tenants(settings)
    return {
        "version": __version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "profile": settings.profile,
        "engine": engine(),
        "interrupt_running_guests": native.SUPPORTED,
        "hold_running_guests": native.HOLDS,
        "quickjs": {
            "version": importlib.metadata.version("quickjs-ng"),
            "tuned": native.NATIVE_BUDGET,
            "arena_bytes": native.ARENA_BYTES,
            "first_arena_bytes": native.FIRST_ARENA_BYTES,
            "discards_runtimes": native.DISCARDS_RUNTIMES,
            "lazy_accessors": native.LAZY_ACCESSORS,
            "lazy_clock": native.LAZY_CLOCK,
            "profile_guided": native.PROFILE_GUIDED,
            "budget_in_c": memory_limit.budget_in_c(),
        },
        "protections": protections,
        "network_mechanism": sandbox.network_mechanism(settings.sandbox, found),
        "warnings": sandbox.warnings(protections) + tenant_warnings(settings, tenants) + descriptor_warnings(settings),
        "unsafe_settings": unsafe_settings(settings, tuple(token for token, _ in tenants), protections),
        "limits": {
            **{key: value for key, value in asdict(settings).items() if key.startswith("max_")},
            "max_sessions": effective_max_sessions(settings),
            "worker_capacity": worker_capacity(settings),
            "warm_workers": settings.warm_workers,
        },
        "timeouts_s": {
            "idle": settings.idle_timeout,
            "handshake": settings.handshake_timeout,
            "send": settings.send_timeout,
            "close": settings.close_timeout,
            "drain_grace": settings.drain_grace,
        },
        "memory_bytes": memory_bytes(),
        "memory_budget_bytes": memory_budget(settings),
    }


def worker_capacity(settings: Settings) -> int:
    """Executions one worker process hosts at once: the hardened profile never runs two in one."""
    return 1 if settings.profile == "hardened" else settings.worker_capacity


def memory_budget(settings: Settings) -> int:
    """``--memory-budget-bytes``, or a share of this machine's (or container's) memory."""
    return settings.memory_budget_bytes or default_memory_budget(memory_bytes())


def effective_max_sessions(settings: Settings) -> int:
    """``--max-sessions`` (a shard's is its share, from the supervisor), or when 0 this process's
    share of what the machine's memory and descriptors carry: shards share the memory."""
    return settings.max_sessions or math.ceil(default_max_sessions(memory_bytes(), raise_open_files()) / shard_count())


def worker_cpu_seconds(settings: Settings) -> int:
    """RLIMIT_CPU of a worker: one execution's budget in the hardened profile; in the standard
    profile a lifetime backstop (deadlines are enforced per execution by interrupts)."""
    if settings.profile == "hardened":
        return int(settings.max_timeout_ms / 1000 + HARDENED_CPU_SLACK_S)
    return STANDARD_CPU_LIFETIME_S


def worker_heap_bytes(settings: Settings) -> int:
    """What the guest heaps of one worker may add up to, for its address-space backstop: one
    execution's limit in the hardened profile; the daemon's budget when a worker hosts many."""
    if settings.profile == "hardened":
        return settings.max_memory_limit_bytes
    return max(settings.max_memory_limit_bytes, memory_budget(settings) // shard_count())


def worker_arguments(settings: Settings) -> list[str]:
    args = [
        "--max-memory",
        str(worker_heap_bytes(settings)),
        "--threads",
        str(1 if settings.profile == "hardened" else settings.worker_threads),
        "--cpu-seconds",
        str(worker_cpu_seconds(settings)),
        "--max-output",
        str(settings.max_output_bytes),
    ]
    return args if settings.sandbox else [*args, "--no-sandbox"]


def accepted_tenants(settings: Settings) -> tuple[tuple[bytes, Tenant], ...]:
    """Each accepted bearer token and its tenant."""
    return read_tenants(settings.tokens, settings.tokens_file)


def accepted_tokens(settings: Settings) -> tuple[bytes, ...]:
    return tuple(token for token, _ in accepted_tenants(settings))
