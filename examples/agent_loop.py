"""An agent-style tool loop: a model writes JavaScript against your Python tools; a sandbox runs it.

The model sees the tools only as TypeScript declarations (``providers.types``)
and answers with code. The code runs in a private local runner
(``Runner.local()``: sandboxed QuickJS workers, no server to start by hand),
calling back into the Python functions below. Whatever happens (a result, a
thrown error, a rejected tool input) goes back to the model as the next
message, until it has an answer.

No model is bundled: ``ScriptedModel`` replays two plausible turns, the first
with a mistake the loop reports back. Put your LLM call in its place.

    python examples/agent_loop.py
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Literal

from execbox_runner.client import ExecuteResult, Providers, Runner, ToolError

MAX_TURNS = 4


@dataclass
class Item:
    sku: str
    name: str
    stock: int


CATALOG = [Item("L-100", "desk lamp", 12), Item("L-200", "floor lamp", 0), Item("C-300", "office chair", 4)]
PRICES_EUR = {"L-100": 39.0, "L-200": 89.0, "C-300": 149.0}


def find_items(query: str, in_stock_only: bool = False) -> list[Item]:
    """Catalog items whose name contains the query."""
    return [item for item in CATALOG if query in item.name and (item.stock > 0 or not in_stock_only)]


async def get_price(sku: str, currency: Literal["EUR", "USD"] = "EUR") -> float:
    """The current price of one item."""
    await asyncio.sleep(0.01)  # stands for a call to a pricing service
    if sku not in PRICES_EUR:
        raise ToolError("validation_error", f"unknown sku {sku}")
    return round(PRICES_EUR[sku] * (1.08 if currency == "USD" else 1.0), 2)


PROVIDERS = Providers({"shop": {"find_items": find_items, "get_price": get_price}})


class ScriptedModel:
    """Stands in for an LLM: given the conversation, returns the next code to run."""

    TURNS = (
        # A first attempt with a typo in the currency, which the tool's type hint rejects.
        """```js
        const lamps = await shop.find_items({query: "lamp", in_stock_only: true});
        const prices = await Promise.all(lamps.map((l) => shop.get_price({sku: l.sku, currency: "usd"})));
        lamps.map((l, i) => ({name: l.name, price: prices[i]}))
        ```""",
        """```js
        const lamps = await shop.find_items({query: "lamp", in_stock_only: true});
        const prices = await Promise.all(lamps.map((l) => shop.get_price({sku: l.sku, currency: "USD"})));
        console.log(`found ${lamps.length} lamp(s) in stock`);
        lamps.map((l, i) => ({name: l.name, price: prices[i]}))
        ```""",
    )

    def __init__(self) -> None:
        self.turn = 0

    async def write_code(self, messages: list[dict[str, str]]) -> str:
        code = self.TURNS[min(self.turn, len(self.TURNS) - 1)]
        self.turn += 1
        return code


def feedback(result: ExecuteResult) -> str:
    """What the model reads after its code ran."""
    logs = "".join(f"log: {line}\n" for line in result.logs)
    if result.error is not None:
        return f"{logs}error {result.error.code}: {result.error.message}"
    return f"{logs}result: {json.dumps(result.result)}"


async def main() -> int:
    model = ScriptedModel()
    task = "Which lamps are in stock, and what do they cost in USD?"
    messages = [
        {"role": "system", "content": f"Answer with JavaScript. These globals are available:\n{PROVIDERS.types}"},
        {"role": "user", "content": task},
    ]
    print(messages[0]["content"], end="\n\n")
    async with Runner.local() as runner:
        for turn in range(1, MAX_TURNS + 1):
            code = await model.write_code(messages)
            result = await runner.execute(code, PROVIDERS, timeout_ms=5_000)
            messages += [{"role": "assistant", "content": code}, {"role": "user", "content": feedback(result)}]
            print(f"turn {turn}: {feedback(result)}")
            if result.ok:
                print(f"answer: {json.dumps(result.result)}")
                return 0
    return 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
