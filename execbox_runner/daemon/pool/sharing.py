"""Tenants' parts of a shared machine, given to their workers as ``Share`` messages.

Guests of every tenant run in worker threads of one priority, and the kernel shares the CPU
between runnable threads alike: a tenant with sixty guests spinning would take sixty times the CPU
of a tenant with one, and delay every short step of the others. So while several tenants are
active (an execution now, or in the last ``ACTIVE_S``), each tenant's workers let at most its
part of the machine's guests compute at once (``tenants.shares``, split between the tenant's
workers); the others of its guests that compute wait their turn (``worker/turns.py``). A tenant
alone is not held back.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Final

from ...protocol import ipc
from .worker import Worker

# A tenant counts towards the sharing this long after its last execution ended (so that a host
# running one execution after another keeps its part between them).
ACTIVE_S: Final = 2.0
# How often tenants that stopped being active are looked for.
REVIEW_S: Final = 1.0

Shares = Callable[[Collection[str]], dict[str, int]]


class Sharing:
    """Which tenants are active, and what each of their workers was last told it may run."""

    def __init__(self, shares: Shares) -> None:
        """``shares``: how many guests each named active tenant may run at once (a tenant left
        out: as many as its threads allow)."""
        self.shares = shares
        self.active: frozenset[str] = frozenset()

    def share_out(self, workers: Iterable[Worker], now: float) -> None:
        """Count the active tenants among ``workers``' owners, and send a ``Share`` to each
        worker whose part changed."""
        owned: dict[str, list[Worker]] = {}
        active = set()
        for worker in workers:
            if worker.tenant is not None and worker.alive:
                owned.setdefault(worker.tenant, []).append(worker)
                if worker.leases or now - worker.idle_since < ACTIVE_S:
                    active.add(worker.tenant)
        self.active = frozenset(active)
        steps = self.shares(self.active)
        for tenant, held in owned.items():
            each = -(-steps.get(tenant, 0) // len(held))  # 0: no part, as many as its threads allow
            for worker in held:
                if worker.share != each:
                    worker.share = each
                    worker.send(0, ipc.Share(each))
