"""Approvals for MCP clients of the stateless protocol (2026-07-28 and later), in rounds.

Such a client has no channel for a question in the middle of a call: a server that needs the
user's input answers the call with ``input_required`` (the questions, and an opaque
``requestState``), and the client calls again with the answers and that state. A program that
calls a tool needing approval cannot be restarted for each round (its calls so far would be made
twice), so it runs on here, in a task of this server, waiting for the answer: the first round
starts it and returns its question, each later round finds it by its ``requestState`` (an
unguessable name, known only to the client that started it), hands it the answer and returns its
next question or its result. A program waits for an answer within its execution's timeout, as
with any client; a result nobody collects is dropped after ``KEEP_RESULT_S``; a round the client
gives up (cancels, or disconnects from) ends its program. The program's progress goes to the round
open at the time. Programs live in this process's memory: behind a load balancer, the rounds of
one call must reach the same server.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final

import anyio
import mcp_types
from anyio.abc import TaskGroup
from mcp.server.elicitation import render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp_types.version import is_version_at_least

from ..client import ApprovalRequest
from .approval import Approval, question, verdict
from .codemode import CodeMode, Report

STATELESS_VERSION: Final = "2026-07-28"  # the first protocol revision that asks in rounds
KEY: Final = "approve"  # the one question a round asks, in ``inputRequests``
KEEP_RESULT_S: Final = 60.0


def asks_in_rounds(context: Context) -> bool:
    """Whether the client's protocol asks in rounds (else the server asks it mid-call)."""
    version = context.protocol_version
    return version is not None and is_version_at_least(version, STATELESS_VERSION)


@dataclass(eq=False)
class _Program:
    """A program of this server's, between rounds: its open question or its result."""

    asking: tuple[ApprovalRequest, anyio.Event, list[bool | str]] | None = None
    result: mcp_types.CallToolResult | None = None
    changed: anyio.Event = field(default_factory=anyio.Event)
    report: Report | None = None  # the progress of the round open now, if any
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)  # its task's

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """The program's progress, told to the round open now (between rounds, to nobody)."""
        if self.report is not None:
            await self.report(progress, total, message)

    async def ask(self, request: ApprovalRequest) -> bool | str:
        answered, answer = anyio.Event(), list[bool | str]()
        self.asking = (request, answered, answer)
        self.changed.set()
        await answered.wait()
        return answer[0]

    def answer(self, given: bool | str) -> None:
        if self.asking is not None:
            _, answered, answer = self.asking
            self.asking = None
            answer.append(given)
            answered.set()

    async def settled(self) -> None:
        """Return once the program has a question open or a result."""
        while self.result is None and self.asking is None:
            await self.changed.wait()
            self.changed = anyio.Event()


class Rounds:
    """The programs of stateless clients that wait between rounds, by their ``requestState``."""

    def __init__(self, code_mode: CodeMode, tasks: TaskGroup, shown_chars: int) -> None:
        self._code_mode = code_mode
        self._tasks = tasks
        self._shown_chars = shown_chars
        self._programs: dict[str, _Program] = {}

    @classmethod
    @contextlib.asynccontextmanager
    async def running(cls, code_mode: CodeMode, shown_chars: int) -> AsyncIterator[Rounds]:
        """Rounds whose programs run in a task group of their own, cancelled on the way out."""
        async with anyio.create_task_group() as tasks:
            yield cls(code_mode, tasks, shown_chars)
            tasks.cancel_scope.cancel()

    async def execute_code(
        self, code: str, context: Context
    ) -> mcp_types.CallToolResult | mcp_types.InputRequiredResult:
        """One round of ``execute_code``: the program's result, or its next question."""
        state = context.request_state
        if state is None:
            state, program = secrets.token_urlsafe(24), _Program()
            self._programs[state] = program
            self._tasks.start_soon(self._run, state, program, code)
        else:
            found = self._programs.get(state)
            if found is None:
                text = "this program is no longer waiting for an answer: run it again"
                return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)], is_error=True)
            program = found
            response = (context.input_responses or {}).get(KEY)
            if isinstance(response, mcp_types.ElicitResult):
                program.answer(verdict(response.action, response.content or {}))
            else:
                program.answer("the user could not be asked (no answer came back)")
        program.report = context.report_progress
        try:
            await program.settled()
        except anyio.get_cancelled_exc_class():  # the client gave the call up: so does the program
            program.scope.cancel()
            self._programs.pop(state, None)
            raise
        finally:
            program.report = None
        if program.result is not None:
            del self._programs[state]
            program.scope.cancel()  # collected: its task need not keep it any longer
            return program.result
        assert program.asking is not None
        schema = render_elicitation_schema(Approval)
        params = mcp_types.ElicitRequestFormParams(
            message=question(program.asking[0], self._shown_chars), requested_schema=schema
        )
        return mcp_types.InputRequiredResult(
            input_requests={KEY: mcp_types.ElicitRequest(params=params)}, request_state=state
        )

    async def _run(self, state: str, program: _Program, code: str) -> None:
        with program.scope:
            program.result = await self._code_mode.execute_code(code, program.progress, program.ask)
            program.changed.set()
            await anyio.sleep(KEEP_RESULT_S)
        self._programs.pop(state, None)
