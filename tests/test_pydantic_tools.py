"""Tools whose type hints name pydantic models: described, checked and answered by pydantic, through a real runner."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Annotated, Any

import pydantic
import pydantic.dataclasses
import pytest

from execbox_runner.client import Providers, Runner

from .daemonkit import Daemon, running_daemon


class Address(pydantic.BaseModel):
    city: str
    zip: str | None = None


class User(pydantic.BaseModel):
    name: str = pydantic.Field(description="The user's full name.")
    age: int = pydantic.Field(ge=0)
    address: Address


class Opaque:
    """A type neither msgspec nor pydantic can describe."""


received: list[Any] = []


def create(user: User, notify: bool = False, tags: list[str] | None = None) -> User:
    """Create a user."""
    received.append((user, notify, tags))
    return user.model_copy(update={"name": user.name.upper()})


def adults(users: list[User], older_than: int = 17) -> list[User]:
    return [user for user in users if user.age > older_than]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as started:
        yield started


def test_the_models_are_described_to_the_model_writing_code() -> None:
    types = Providers({"users": {"create": create}}).types
    assert "The user's full name." in types
    assert "address: {\n        city: string;\n        zip?: string | null;\n      };" in types
    assert "notify?: boolean;" in types
    assert "}): Promise<{" in types  # the result's shape too, as pydantic serializes a User


def test_inputs_are_models_checked_by_pydantic_and_results_are_their_json(daemon: Daemon) -> None:
    received.clear()
    code = """
        const made = await users.create({user: {name: "ada", age: 36, address: {city: "London"}}});
        const kept = await users.adults({users: [
            {name: "b", age: 12, address: {city: "x"}}, {name: "c", age: 40, address: {city: "y", zip: "1"}},
        ]});
        const errors = [];
        for (const input of [
            {user: {name: "d", age: -1, address: {city: "x"}}},
            {user: {name: "d", age: 1, address: {}}},
            {user: {name: "d", age: 1, address: {city: "x"}}, extra: 1},
            {},
        ]) {
            try { await users.create(input); errors.push("no error"); } catch (e) { errors.push(`${e.code}: ${e.message}`); }
        }
        const odd = await users.opaque().catch((e) => e.code);  // not a model: refused, as without pydantic
        ({made, kept, errors, odd})
    """
    with Runner.connect(daemon.url) as runner:
        result = runner.execute_sync(code, {"users": {"create": create, "adults": adults, "opaque": Opaque}})
    assert result.ok, result.error
    assert result.result == {
        "made": {"name": "ADA", "age": 36, "address": {"city": "London", "zip": None}},
        "kept": [{"name": "c", "age": 40, "address": {"city": "y", "zip": "1"}}],
        "errors": [
            "validation_error: Invalid input for tool create: Input should be greater than or equal to 0"
            " - at `$.user.age`",
            "validation_error: Invalid input for tool create: Field required - at `$.user.address.city`",
            "validation_error: Invalid input for tool create: Extra inputs are not permitted - at `$.extra`",
            "validation_error: Invalid input for tool create: Field required - at `$.user`",
        ],
        "odd": "serialization_error",
    }
    [(user, notify, tags)] = received  # only the valid call ran, with the function's own defaults
    assert user == User(name="ada", age=36, address=Address(city="London"))
    assert (notify, tags) == (False, None)


@pydantic.dataclasses.dataclass
class Point:
    x: int

    @pydantic.field_validator("x")
    @classmethod
    def on_the_grid(cls, x: int) -> int:
        if x % 10:
            raise ValueError("x must be a multiple of 10")
        return x


def place(count: Annotated[int, pydantic.Field(ge=0, description="How many.")], at: Point) -> int:
    return count + at.x


def test_what_only_pydantic_reads_in_a_hint_is_checked_by_pydantic(daemon: Daemon) -> None:
    """Hints msgspec takes while ignoring what pydantic alone reads (a ``Field``'s bounds and
    description in ``Annotated``, a pydantic dataclass's validators) are pydantic's too: what the
    model reads and what the host enforces are still the same."""
    assert "How many." in Providers({"grid": {"place": place}}).types
    code = """
        const out = [await grid.place({count: 1, at: {x: 20}})];
        for (const input of [{count: -1, at: {x: 20}}, {count: 1, at: {x: 5}}]) {
            out.push(await grid.place(input).catch((e) => `${e.code}: ${e.message}`));
        }
        out
    """
    with Runner.connect(daemon.url) as runner:
        result = runner.execute_sync(code, {"grid": {"place": place}})
    assert result.result == [
        21,
        "validation_error: Invalid input for tool place: Input should be greater than or equal to 0 - at `$.count`",
        "validation_error: Invalid input for tool place: Value error, x must be a multiple of 10 - at `$.at.x`",
    ]


def lookup(key: Opaque) -> None:
    del key


def test_a_hint_neither_msgspec_nor_pydantic_describes_names_the_tool() -> None:
    with pytest.raises(TypeError, match=r"(?s)^tool 'lookup': .*Opaque.*give Tool\(\.\.\., input_schema=\.\.\.\)$"):
        Providers({"store": {"lookup": lookup}})


def test_a_program_without_pydantic_never_imports_it() -> None:
    program = (
        "import sys\n"
        "from execbox_runner.client import Providers\n"
        "providers = Providers({'tools': {'add': lambda a, b=1: a + b}})\n"
        "assert 'export' not in providers.types\n"
        "print('pydantic' in sys.modules)\n"
    )
    finished = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True)
    assert finished.stdout.strip() == "False"
