"""Approvals in rounds for MCP clients of the stateless protocol (``mcp/rounds.py``): a program
waits in the server between rounds, found again by its ``requestState``; an unknown state, and a
round the client gives up, are answered. The whole path with the official client is in
test_mcp.py (``test_a_tool_named_in_approve_asks_the_user_through_elicitation``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types

from execbox_runner.client import ApprovalRequest
from execbox_runner.mcp.codemode import Ask, Report
from execbox_runner.mcp.rounds import KEY, Rounds


class AskingCodeMode:
    """A code mode whose program asks twice, then returns the answers it got."""

    def __init__(self) -> None:
        self.ended = anyio.Event()

    async def execute_code(self, code: str, report: Report | None, ask: Ask | None) -> mcp_types.CallToolResult:
        assert ask is not None and report is not None
        try:
            answers = [await ask(ApprovalRequest("up", "remove", {"path": path})) for path in ("/a", "/b")]
            await report(1, None, "asked twice")
        finally:
            self.ended.set()
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=repr(answers))])


@dataclass
class Round:
    """What ``Rounds`` reads of a round's MCP context."""

    request_state: str | None = None
    input_responses: dict[str, Any] | None = None
    reported: list[str | None] | None = None

    async def report_progress(self, progress: float, total: float | None, message: str | None) -> None:
        assert self.reported is not None
        self.reported.append(message)


def test_a_program_waits_between_rounds_for_each_answer_and_returns_its_result() -> None:
    async def main() -> None:
        code_mode = AskingCodeMode()
        async with Rounds.running(code_mode, 100) as rounds:  # type: ignore[arg-type]
            first = await rounds.execute_code("x", Round())  # type: ignore[arg-type]
            assert isinstance(first, mcp_types.InputRequiredResult) and first.request_state
            asked = first.input_requests[KEY]
            assert isinstance(asked, mcp_types.ElicitRequest) and 'up.remove({"path": "/a"})' in asked.params.message
            yes = mcp_types.ElicitResult(action="accept", content={"approve": True})
            second = await rounds.execute_code("x", Round(first.request_state, {KEY: yes}))  # type: ignore[arg-type]
            assert isinstance(second, mcp_types.InputRequiredResult) and second.request_state == first.request_state
            reported: list[str | None] = []
            no = mcp_types.ElicitResult(action="decline")
            last = await rounds.execute_code("x", Round(first.request_state, {KEY: no}, reported))  # type: ignore[arg-type]
            assert isinstance(last, mcp_types.CallToolResult)
            assert last.content[0].text == "[True, 'the user declined']"  # type: ignore[union-attr]
            assert reported == ["asked twice"]  # the program's progress went to the round open then
            again = await rounds.execute_code("x", Round(first.request_state, {KEY: yes}))  # type: ignore[arg-type]
            assert isinstance(again, mcp_types.CallToolResult) and again.is_error
            assert "no longer waiting" in again.content[0].text  # type: ignore[union-attr]

    anyio.run(main)


def test_a_round_the_client_gives_up_ends_its_program() -> None:
    async def main() -> None:
        code_mode = AskingCodeMode()
        async with Rounds.running(code_mode, 100) as rounds:  # type: ignore[arg-type]
            first = await rounds.execute_code("x", Round())  # type: ignore[arg-type]
            assert isinstance(first, mcp_types.InputRequiredResult)
            yes = mcp_types.ElicitResult(action="accept", content={"approve": True})
            with anyio.move_on_after(0):  # given up at once, before the program asks again
                await rounds.execute_code("x", Round(first.request_state, {KEY: yes}))  # type: ignore[arg-type]
            with anyio.fail_after(5):
                await code_mode.ended.wait()
            gone = await rounds.execute_code("x", Round(first.request_state, {KEY: yes}))  # type: ignore[arg-type]
            assert isinstance(gone, mcp_types.CallToolResult) and gone.is_error

    anyio.run(main)
