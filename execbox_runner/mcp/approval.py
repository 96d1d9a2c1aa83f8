"""What code mode asks the user before a program calls a tool that needs approval, and what the
answer means: one question and one reading of it, whether the server asks mid-call
(``server.ask_the_user``) or in rounds (``rounds.py``)."""

from __future__ import annotations

import json

from pydantic import BaseModel, Field, ValidationError

from ..client import ApprovalRequest


class Approval(BaseModel):
    """What the user answers when a program calls a tool that needs approval."""

    approve: bool = Field(description="let the program make this call")


def question(request: ApprovalRequest, shown_chars: int) -> str:
    """What the user is asked about ``request``, its input cut to ``shown_chars``."""
    shown = json.dumps(request.input, ensure_ascii=False)
    shown = shown if len(shown) <= shown_chars else shown[:shown_chars] + "..."
    return f"The program calls {request.provider}.{request.tool}({shown}). Allow it?"


def verdict(action: str, content: object) -> bool | str:
    """The user's answer (an elicitation's ``action`` and ``content``): ``True``, or why not."""
    if action == "accept":
        try:
            approved = Approval.model_validate(content).approve
        except ValidationError:
            return "the user's answer did not say"
        return True if approved else "the user refused"
    return "the user declined" if action == "decline" else "the user cancelled"
