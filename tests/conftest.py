"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest

from execbox_runner.worker import native

# Where a runtime's memory budget is checked: in QuickJS itself (a build of deploy/quickjs/build.py)
# or in the allocator hooks (any other build, where the native layout holds). Both must classify
# every out-of-memory alike; a test taking ``budget`` runs once for each this environment has.
BUDGETS = ["in the hooks", *(["in C"] if native.budget_in_c() else [])]


@pytest.fixture(params=BUDGETS)
def budget(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "in the hooks":
        monkeypatch.setattr(native, "_native_budget", False)
    return str(request.param)
