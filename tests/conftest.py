"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from execbox_runner.worker import memory_limit

# Where a runtime's memory budget is checked: in QuickJS itself (a build of deploy/quickjs/build.py)
# or in the allocator hooks (any other build, where the native layout holds). Both must classify
# every out-of-memory alike; a test taking ``budget`` runs once for each this environment has.
BUDGETS = ["in the hooks", *(["in C"] if memory_limit.budget_in_c() else [])]


@pytest.fixture(params=BUDGETS)
def budget(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "in the hooks":
        monkeypatch.setattr(memory_limit, "_native_budget", False)
    return str(request.param)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The soak's knobs (``tests/test_soak.py``, run by ``pytest -m stress``)."""
    group = parser.getgroup("soak", "the soak (pytest -m stress)")
    group.addoption("--soak-seconds", type=float, default=60.0, help="seconds of load (default 60)")
    group.addoption("--soak-clients", type=int, default=32, help="concurrent host connections (default 32)")
    group.addoption("--soak-sentinels", type=int, default=2, help="executions kept parked 40 s at a time (default 2)")
    group.addoption("--soak-seed", type=int, default=1, help="seed of the session mix (default 1)")
    group.addoption(
        "--soak-tenants", type=int, default=0, help="spread the clients over N tenants (default 0: no tokens)"
    )
    group.addoption("--soak-kinds", default="", help="a comma-separated subset of the mix (default: all of it)")
    group.addoption(
        "--soak-daemon-arg", action="append", default=[], help="passed on to the daemon (repeat for several)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The soak's time limit follows its length: the load, a sentinel's last park, the settling."""
    limit = config.getoption("--soak-seconds") + 300
    for item in items:
        if item.get_closest_marker("stress") is not None:
            item.add_marker(pytest.mark.timeout(limit))
