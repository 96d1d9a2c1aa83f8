"""Named tenants: whose a bearer token is, and how much of the runner that tenant may take.

A line of the tokens file is a token, then optionally ``name=value`` settings::

    s3cret-for-acme    tenant=acme  max_sessions=20  executions_per_minute=600  memory_in_flight_bytes=2147483648
    other-acme-token   tenant=acme
    s3cret-for-globex  tenant=globex  max_sessions=5

Tokens of one tenant share its name, quotas and weight (set on any of its lines; two lines that
disagree are refused). A token without ``tenant=`` is a tenant of its own, named ``token-N`` after its
place among the tokens (as tokens were before names), with no quotas. Tenant names are labels in
metrics and log lines, never the token: letters, digits, ``.``, ``_`` and ``-``, at most 64.

Quotas, each per tenant and per daemon process (with ``--processes``, each shard counts its own):

- ``max_sessions``: sessions open at once;
- ``executions_per_minute``: executions started in the last 60 s;
- ``memory_in_flight_bytes``: the sum of the ``memoryLimitBytes`` of its executions running now,
  a new execution's own included;
- ``cpu_seconds_per_minute``: CPU its worker processes spent in the last 60 s, sampled each second
  (its guests' CPU: it needs the tenant's own workers, so not with ``--share-workers-across-tokens``).

A tenant at one of them gets ``429 Too Many Requests`` at the handshake, before any session
exists, with ``Retry-After`` and a JSON body naming the quota (``Ledger.refusal``). Quotas are
judged when a session opens: the executions of a session already open count towards them.

``weight`` (default 1) is the tenant's share of a busy machine against the other tenants': while
several tenants are active, each may have a number of guests computing at once in proportion to
it (``shares``), which the pool gives its workers.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from ..exposure import check_sendable, token_entries

QUOTAS: Final = ("max_sessions", "executions_per_minute", "memory_in_flight_bytes", "cpu_seconds_per_minute")
SETTINGS: Final = (*QUOTAS, "weight")
WINDOW_S: Final = 60.0
_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class Tenant:
    """A tenant's name and quotas (None: no quota)."""

    name: str
    max_sessions: int | None = None
    executions_per_minute: int | None = None
    memory_in_flight_bytes: int | None = None
    cpu_seconds_per_minute: int | None = None
    weight: int = 1  # its share of the CPU against the other tenants' (``shares``)


def read_tenants(inline: str, path: str) -> tuple[tuple[bytes, Tenant], ...]:
    """Each accepted token and its tenant: ``inline`` tokens (comma-separated, no settings), then
    the lines of the file at ``path``. Raises ``ValueError`` naming the line at fault (a bad
    setting, a token given twice, a token no client could send), OSError for a file that cannot be read."""
    named: dict[str, Tenant] = {}
    tenants: list[tuple[bytes, str]] = []
    given: dict[str, str] = {}  # each token -> where: its line of the file, or "" inline
    for index, (entry, where) in enumerate(token_entries(inline, path)):
        token, _, settings = entry.partition(" ") if where else (entry, "", "")  # settings: the file's only
        check_sendable(token, where)
        if token in given:  # one of the two would be ignored, its tenant's quotas with it
            raise ValueError(_again(where, given[token]))
        given[token] = where
        tenant = _tenant(index, where, settings)
        known = named.get(tenant.name)
        if known is None or (_has_settings(tenant) and not _has_settings(known)):
            named[tenant.name] = tenant
        elif _has_settings(tenant) and tenant != known:
            raise ValueError(f"{where}: tenant {tenant.name!r} has other settings on another line")
        tenants.append((token.encode(), tenant.name))
    return tuple((token, named[name]) for token, name in tenants)


def _again(where: str, first: str) -> str:
    """Why a token given a second time (``where``; ``first``: the first time) is refused: inline
    tokens come first, so a file's line may repeat one of them, never the other way round."""
    if first:
        return f"{where}: the token of {first} again (a token is one tenant's)"
    if where:
        return f"{where} of the tokens file gives one of these tokens again (a token is one tenant's)"
    return "one token given twice (a token is one tenant's)"


def _tenant(index: int, where: str, text: str) -> Tenant:
    values: dict[str, str | int] = {}
    for item in text.split():
        key, equals, value = item.partition("=")
        if not equals or key not in ("tenant", *SETTINGS):
            raise ValueError(f"{where}: {item!r} is not tenant=NAME or one of {', '.join(q + '=N' for q in SETTINGS)}")
        if key in values:  # which one was meant is not for the runner to guess
            raise ValueError(f"{where}: {key} is given twice")
        if key == "tenant":
            if not _NAME.fullmatch(value):
                raise ValueError(f"{where}: tenant name {value!r} must be 1-64 letters, digits, '.', '_' or '-'")
            values[key] = value
        elif not value.isdigit() or int(value) < 1:
            raise ValueError(f"{where}: {key} must be a whole number of at least 1, got {value!r}")
        else:
            values[key] = int(value)
    name = str(values.pop("tenant", f"token-{index}"))
    return Tenant(name, **{key: int(value) for key, value in values.items()})


def _has_quotas(tenant: Tenant) -> bool:
    return any(getattr(tenant, quota) is not None for quota in QUOTAS)


def _has_settings(tenant: Tenant) -> bool:
    return _has_quotas(tenant) or tenant.weight != 1


def shares(weights: Mapping[str, int], cores: int) -> dict[str, int]:
    """How many of its guests each tenant may run at once, by name, while several tenants are
    active (``weights``: theirs); none (empty) for a tenant alone, which takes what its workers'
    threads allow.

    The kernel shares the CPU between runnable threads alike (workers all run at one priority),
    so a tenant's part of a busy machine is its part of the threads computing: each tenant may
    compute on its weight's part of ``cores``, at least one thread. Tenants of equal weight then
    split a saturated machine equally however many executions each runs, and one tenant's
    spinning guests leave the others' short steps the cores it does not hold.
    """
    if len(weights) < 2:
        return {}
    total = sum(weights.values())
    return {name: max(1, round(cores * weight / total)) for name, weight in weights.items()}


@dataclass
class _Usage:
    sessions: int = 0
    started: deque[float] = field(default_factory=deque)  # when each execution of the window started
    memory: int = 0
    cpu: deque[tuple[float, float]] = field(default_factory=deque)  # (when, CPU seconds) samples of the window


class Ledger:
    """What each tenant takes now, and the refusal of a handshake past one of its quotas."""

    def __init__(self, tenants: Iterable[Tenant] = ()) -> None:
        self._quotas = {tenant.name: tenant for tenant in tenants if _has_quotas(tenant)}
        self._usage: dict[str, _Usage] = {name: _Usage() for name in self._quotas}

    def refusal(
        self, name: str, now: float, *, opening: bool = True, memory_limit: int = 0
    ) -> tuple[str, float, str] | None:
        """(quota, seconds until it may allow one, message) when ``name`` is at a quota; else None.
        ``opening``: for a session to open (every quota); else for an execution on an open session
        (every quota but ``max_sessions``, which that session is already counted in), asking for
        ``memory_limit`` bytes: refused if they would take the tenant past ``memory_in_flight_bytes``,
        so that the quota bounds the sum rather than only the executions that start under it."""
        tenant, usage = self._quotas.get(name), self._usage.get(name)
        if tenant is None or usage is None:
            return None
        if opening and tenant.max_sessions is not None and usage.sessions >= tenant.max_sessions:
            return "max_sessions", 1.0, f"tenant {name} has its maximum of {tenant.max_sessions} sessions open"
        started = self._window(usage, now)
        if tenant.executions_per_minute is not None and len(started) >= tenant.executions_per_minute:
            wait = started[len(started) - tenant.executions_per_minute] + WINDOW_S - now
            limit = tenant.executions_per_minute
            return (
                "executions_per_minute",
                max(wait, 1.0),
                f"tenant {name} started {limit} executions in the last minute",
            )
        budget = tenant.memory_in_flight_bytes
        if budget is not None and (usage.memory >= budget or usage.memory + memory_limit > budget):
            asked = f", and this execution asks for {memory_limit}" if memory_limit else ""
            message = f"tenant {name}'s running executions hold {usage.memory} of its {budget} bytes{asked}"
            return "memory_in_flight_bytes", 1.0, message
        if tenant.cpu_seconds_per_minute is not None:
            while usage.cpu and usage.cpu[0][0] <= now - WINDOW_S:
                usage.cpu.popleft()
            if sum(seconds for _, seconds in usage.cpu) >= tenant.cpu_seconds_per_minute:
                limit = tenant.cpu_seconds_per_minute
                wait = usage.cpu[0][0] + WINDOW_S - now
                return (
                    "cpu_seconds_per_minute",
                    max(wait, 1.0),
                    f"tenant {name}'s guests spent {limit} s of CPU in the last minute",
                )
        return None

    def add_cpu(self, name: str, seconds: float, now: float) -> None:
        """CPU ``name``'s workers spent since the last sample."""
        if (usage := self._usage.get(name)) is not None and seconds > 0:
            usage.cpu.append((now, seconds))

    def session_opened(self, name: str) -> None:
        if (usage := self._usage.get(name)) is not None:
            usage.sessions += 1

    def session_closed(self, name: str) -> None:
        if (usage := self._usage.get(name)) is not None:
            usage.sessions -= 1

    def execution_started(self, name: str, memory_limit: int, now: float) -> None:
        if (usage := self._usage.get(name)) is not None:
            self._window(usage, now).append(now)
            usage.memory += memory_limit

    def execution_ended(self, name: str, memory_limit: int) -> None:
        if (usage := self._usage.get(name)) is not None:
            usage.memory -= memory_limit

    @staticmethod
    def _window(usage: _Usage, now: float) -> deque[float]:
        """The starts of the last minute (older ones dropped)."""
        while usage.started and usage.started[0] <= now - WINDOW_S:
            usage.started.popleft()
        return usage.started
