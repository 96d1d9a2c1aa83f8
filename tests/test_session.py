"""The Sans-I/O session: every protocol rule, without sockets or processes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execbox_runner.protocol import ipc
from execbox_runner.protocol.session import (
    CLOSE_INVALID_PAYLOAD,
    CLOSE_POLICY_VIOLATION,
    CLOSE_UNSUPPORTED_DATA,
    CloseTransport,
    ExecutionEnded,
    ReleaseWorker,
    SendToHost,
    SendToWorker,
    Session,
    StartRun,
)

OPTIONS = {"timeoutMs": 1000, "memoryLimitBytes": 67108864, "maxLogLines": 100, "maxLogChars": 64000}
PROVIDERS = [{"name": "tools", "tools": {"echo": {"safeName": "echo", "originalName": "echo"}}, "types": ""}]


def execute(exec_id: str = "e1", **overrides: Any) -> bytes:
    message = {"type": "execute", "id": exec_id, "code": "1", "options": OPTIONS, "providers": PROVIDERS, **overrides}
    return json.dumps(message).encode()


def sent(actions: list) -> list[dict]:
    return [json.loads(a.data) for a in actions if isinstance(a, SendToHost)]


def calls(*ids: int) -> ipc.ToolCalls:
    return ipc.ToolCalls(calls=[(i, "tools", "echo", b'{"n":1}') for i in ids], logs=[])


def finished_ok(result: bytes | None = b"1", logs: list[str] | None = None) -> ipc.Finished:
    return ipc.Finished(ok=True, result=result, code=None, message="", logs=logs or [])


def started_session() -> Session:
    session = Session()
    session.receive_text(execute(), 0.0)
    return session


def test_execute_sends_started_then_starts_a_run_with_the_limits() -> None:
    actions = Session().receive_text(execute(), 10.0)
    assert sent(actions) == [{"type": "started", "id": "e1"}]
    run = next(a.run for a in actions if isinstance(a, StartRun))
    assert (run.budget_s, run.memory_limit, run.max_log_lines, run.max_log_chars, run.providers) == (
        1.0,
        67108864,
        100,
        64000,
        [("tools", ["echo"])],
    )


def test_an_execute_the_runner_does_not_admit_ends_at_once_without_starting() -> None:
    reasons: list[str | None] = ["tenant t is at a quota", None]
    asked: list[str] = []
    session = Session(admit=lambda execution_id, memory: asked.append(f"{execution_id} {memory}") or reasons.pop(0))
    actions = session.receive_text(execute("refused"), 5.0)
    assert sent(actions) == [
        {
            "type": "done",
            "id": "refused",
            "ok": False,
            "durationMs": 0,
            "logs": [],
            "error": {"code": "internal_error", "message": "tenant t is at a quota"},
        }
    ]
    assert not any(isinstance(action, StartRun) for action in actions) and session.execution_id is None
    assert sent(session.receive_text(execute("admitted"), 6.0)) == [{"type": "started", "id": "admitted"}]
    assert asked == ["refused 67108864", "admitted 67108864"] and reasons == []  # asked once for each, with its memory


def test_tool_calls_are_numbered_and_results_correlated_once() -> None:
    session = started_session()
    assert sent(session.worker_tool_calls(calls(1, 2), 0.1)) == [
        {"type": "tool_call", "callId": "call-1", "providerName": "tools", "safeToolName": "echo", "input": {"n": 1}},
        {"type": "tool_call", "callId": "call-2", "providerName": "tools", "safeToolName": "echo", "input": {"n": 1}},
    ]
    result = json.dumps({"type": "tool_result", "callId": "call-2", "ok": True}).encode()
    (action,) = session.receive_text(result, 0.2)
    assert action == SendToWorker(ipc.Settle(call_id=2, ok=True, value=None))
    assert session.receive_text(result, 0.3) == []  # settled: ignored
    unknown = json.dumps({"type": "tool_result", "callId": "call-9", "ok": True, "result": 1}).encode()
    assert session.receive_text(unknown, 0.3) == []
    failing = json.dumps(
        {"type": "tool_result", "callId": "call-1", "ok": False, "error": {"code": "tool_error", "message": "no"}}
    ).encode()
    assert session.receive_text(failing, 0.4) == [SendToWorker(ipc.Settle.reject(1, "tool_error", "no"))]


def test_call_ids_go_on_across_executions_so_a_late_result_answers_no_later_call() -> None:
    session = started_session()
    session.worker_tool_calls(calls(1), 0.1)
    session.receive_text(json.dumps({"type": "cancel", "id": "e1"}).encode(), 0.2)
    session.worker_finished(ipc.Finished(ok=False, result=None, code="timeout", message="", logs=[]), 0.21)
    session.receive_text(execute("e2"), 0.3)
    assert [m["callId"] for m in sent(session.worker_tool_calls(calls(1), 0.4))] == ["call-2"]
    late = json.dumps({"type": "tool_result", "callId": "call-1", "ok": True, "result": "stale"}).encode()
    assert session.receive_text(late, 0.5) == []
    fresh = json.dumps({"type": "tool_result", "callId": "call-2", "ok": True, "result": 2}).encode()
    assert session.receive_text(fresh, 0.6) == [SendToWorker(ipc.Settle(call_id=1, ok=True, value=b"2"))]


def test_a_tool_error_code_outside_the_stable_set_reaches_the_guest_as_tool_error_and_is_recorded() -> None:
    session = started_session()
    session.worker_tool_calls(calls(1, 2), 0.1)
    for call, code in (("call-1", "not_found"), ("call-2", "validation_error")):
        failing = {"type": "tool_result", "callId": call, "ok": False, "error": {"code": code, "message": "no page"}}
        (action,) = session.receive_text(json.dumps(failing).encode(), 0.2)
        expected = "tool_error" if code == "not_found" else code
        assert action == SendToWorker(ipc.Settle.reject(int(call[-1]), expected, "no page"))
    finished = ipc.Finished(ok=False, result=None, code="tool_error", message="no page", logs=[])
    actions = session.worker_finished(finished, 0.3)
    assert sent(actions)[0]["error"] == {"code": "tool_error", "message": "no page"}
    (record,) = [a for a in actions if isinstance(a, ExecutionEnded)]
    assert record.unknown_tool_codes == ("not_found",)


def test_undefined_input_omits_the_field_and_undefined_result_omits_result() -> None:
    session = started_session()
    (call,) = sent(session.worker_tool_calls(ipc.ToolCalls(calls=[(1, "tools", "echo", None)], logs=[]), 0.1))
    assert "input" not in call
    (done,) = sent(session.worker_finished(finished_ok(result=None, logs=["a"]), 0.25))
    assert done == {"type": "done", "id": "e1", "ok": True, "durationMs": 250, "logs": ["a"]}


def test_second_execute_gets_its_own_internal_error_and_leaves_the_first_alone() -> None:
    session = started_session()
    (done,) = sent(session.receive_text(execute("e2"), 0.1))
    assert done["id"] == "e2" and done["error"]["code"] == "internal_error" and done["durationMs"] == 0
    assert sent(session.worker_finished(finished_ok(), 0.2))[0]["id"] == "e1"


def test_cancel_for_the_active_id_aborts_and_answers_timeout_within_the_grace() -> None:
    session = started_session()
    assert session.receive_text(json.dumps({"type": "cancel", "id": "other"}).encode(), 0.1) == []
    actions = session.receive_text(json.dumps({"type": "cancel", "id": "e1"}).encode(), 0.2)
    assert actions == [SendToWorker(ipc.Abort())]
    assert session.deadline == pytest.approx(0.2 + session.cancel_grace)
    done_actions = session.timer(session.deadline)
    (done,) = sent(done_actions)
    assert done["error"] == {"code": "timeout", "message": "Execution timed out"}
    assert ReleaseWorker() in done_actions  # the slot is given up; the worker did nothing wrong


def test_aborted_worker_that_answers_in_time_hands_over_its_logs_and_is_kept() -> None:
    session = started_session()
    session.worker_tool_calls(ipc.ToolCalls(calls=[(1, "tools", "echo", None)], logs=["before"]), 0.1)
    session.receive_text(json.dumps({"type": "cancel", "id": "e1"}).encode(), 0.2)
    assert session.worker_tool_calls(calls(2), 0.201) == []  # no tool_call after the abort
    answer = ipc.Finished(ok=False, result=None, code="timeout", message="Execution timed out", logs=["cleanup"])
    actions = session.worker_finished(answer, 0.202)
    assert sent(actions)[0]["logs"] == ["before", "cleanup"]
    assert ReleaseWorker() in actions


def test_wall_clock_timeout_includes_waiting_for_tools() -> None:
    session = started_session()
    session.worker_tool_calls(calls(1), 0.1)
    assert session.timer(0.5) == []
    assert session.timer(1.0) == [SendToWorker(ipc.Abort())]


def test_worker_loss_is_internal_error() -> None:
    session = started_session()
    actions = session.worker_lost(0.1)
    (done,) = sent(actions)
    assert done["error"]["code"] == "internal_error"
    assert ReleaseWorker() in actions  # it died: nothing to hold against it


def test_worker_cannot_call_tools_outside_the_manifest_or_repeat_call_ids() -> None:
    session = started_session()
    actions = session.worker_tool_calls(ipc.ToolCalls(calls=[(1, "tools", "secret", None)], logs=[]), 0.1)
    (done,) = sent(actions)
    assert done["error"]["code"] == "internal_error"
    assert ReleaseWorker(misbehaved=True) in actions  # it may be taken over: it hosts nothing more
    session = started_session()
    session.worker_tool_calls(calls(1), 0.1)
    actions = session.worker_tool_calls(calls(1), 0.2)
    assert sent(actions)[0]["type"] == "done"
    assert ReleaseWorker(misbehaved=True) in actions


def test_calls_a_finished_guest_never_awaited_go_out_before_its_done_unless_the_host_cancelled() -> None:
    session = started_session()
    ended = ipc.Finished(ok=True, result=b"5", code=None, message="", logs=[], calls=calls(1, 2).calls)
    messages = sent(session.worker_finished(ended, 0.1))
    assert [(m["type"], m.get("callId")) for m in messages] == [
        ("tool_call", "call-1"),
        ("tool_call", "call-2"),
        ("done", None),
    ]
    assert messages[2]["result"] == 5
    timed_out = ipc.Finished(
        ok=False, result=None, code="timeout", message="Execution timed out", logs=[], calls=calls(1).calls
    )
    session = started_session()
    assert session.timer(1.0) == [SendToWorker(ipc.Abort())]  # the daemon's timeout: made before it, the call goes out
    assert [m["type"] for m in sent(session.worker_finished(timed_out, 1.001))] == ["tool_call", "done"]
    session = started_session()
    session.receive_text(json.dumps({"type": "cancel", "id": "e1"}).encode(), 0.1)
    assert [m["type"] for m in sent(session.worker_finished(timed_out, 0.101))] == ["done"]  # none after a cancel


def test_a_finished_guests_calls_are_checked_like_any_others() -> None:
    session = started_session()
    session.worker_tool_calls(calls(1), 0.1)
    actions = session.worker_finished(
        ipc.Finished(ok=True, result=b"5", code=None, message="", logs=[], calls=calls(1).calls), 0.2
    )
    (done,) = sent(actions)
    assert done["error"]["code"] == "internal_error"
    assert ReleaseWorker(misbehaved=True) in actions


def test_worker_results_must_be_json() -> None:
    session = started_session()
    actions = session.worker_finished(finished_ok(result=b'1, "ok": true'), 0.1)
    (done,) = sent(actions)
    assert done["error"]["code"] == "internal_error"
    assert ReleaseWorker(misbehaved=True) in actions


def test_malformed_execute_with_an_id_gets_validation_error_and_session_stays_usable() -> None:
    session = Session()
    (done,) = sent(session.receive_text(json.dumps({"type": "execute", "id": "bad", "code": 1}).encode(), 0.0))
    assert done["id"] == "bad" and done["error"]["code"] == "validation_error"
    duplicate = [PROVIDERS[0], PROVIDERS[0]]
    (done,) = sent(session.receive_text(execute("dup", providers=duplicate), 0.0))
    assert done["error"]["code"] == "validation_error" and "unique" in done["error"]["message"]
    assert sent(session.receive_text(execute("good"), 0.0)) == [{"type": "started", "id": "good"}]


def test_frames_without_an_execution_id_close_with_a_specific_code() -> None:
    cases = [
        (b"{nope", CLOSE_INVALID_PAYLOAD),
        (b'{"type":"hello"}', CLOSE_POLICY_VIOLATION),
        (b"[1]", CLOSE_POLICY_VIOLATION),
        (b'{"type":"cancel"}', CLOSE_POLICY_VIOLATION),
    ]
    for frame, code in cases:
        actions = Session().receive_text(frame, 0.0)
        assert [a.code for a in actions if isinstance(a, CloseTransport)] == [code], frame
    assert [a.code for a in Session().receive_binary(0.0) if isinstance(a, CloseTransport)] == [CLOSE_UNSUPPORTED_DATA]


def test_garbage_during_an_execution_fails_it_before_closing() -> None:
    session = started_session()
    actions = session.receive_text(b'{"type":"tool_result","callId":"call-1"}', 0.3)
    (done,) = sent(actions)
    assert done["error"]["code"] == "validation_error"
    assert isinstance(actions[-1], CloseTransport) and actions[-1].code == CLOSE_POLICY_VIOLATION
    assert session.receive_text(execute("late"), 0.4) == []  # closed: nothing more


def test_transport_close_releases_the_worker_without_a_done() -> None:
    session = started_session()
    actions = session.transport_closed(0.5)
    assert (
        actions[0] == ReleaseWorker() and isinstance(actions[1], ExecutionEnded) and actions[1].outcome == "abandoned"
    )
    assert session.worker_finished(finished_ok(), 0.1) == []


# ------------------------------------------------------------------ random orders

host_events = st.one_of(
    st.builds(lambda i: ("execute", f"e{i}"), st.integers(0, 2)),
    st.builds(lambda i: ("cancel", f"e{i}"), st.integers(0, 2)),
    st.builds(lambda i, ok: ("result", f"call-{i}", ok), st.integers(1, 4), st.booleans()),
    st.just(("garbage",)),
)
worker_events = st.one_of(
    st.builds(lambda n: ("calls", n), st.integers(1, 3)),
    st.just(("finish",)),
    st.just(("lost",)),
    st.just(("timer",)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(host_events, worker_events), max_size=30))
def test_protocol_invariants_hold_under_random_message_orders(events: list[tuple]) -> None:
    """Whatever arrives in whatever order: started once and first, exactly one
    done per accepted execution and nothing of it afterwards, unique callIds, a
    worker only while an execution runs, each pending call settled at most once,
    ok/result/error consistent on every done, and a cancelled execution's done a
    timeout (unless an execute reusing its id ends it)."""
    session = Session()
    now = 0.0
    cancelled = False  # the running execution was cancelled
    worker_busy = False
    next_call = 1
    settled: list[int] = []
    call_ids: set[str] = set()
    for event in events:
        now += 0.01
        before = session.execution_id
        kind = event[0]
        if kind == "execute":
            actions = session.receive_text(execute(event[1]), now)
        elif kind == "cancel":
            cancelled = cancelled or event[1] == before
            actions = session.receive_text(json.dumps({"type": "cancel", "id": event[1]}).encode(), now)
        elif kind == "result":
            error = {} if event[2] else {"error": {"code": "tool_error", "message": "x"}}
            actions = session.receive_text(
                json.dumps({"type": "tool_result", "callId": event[1], "ok": event[2], **error}).encode(), now
            )
        elif kind == "garbage":
            actions = session.receive_text(b"not json", now)
        elif not worker_busy:
            continue  # worker events only exist while a worker runs
        elif kind == "calls":
            ids = list(range(next_call, next_call + event[1]))
            next_call += event[1]
            actions = session.worker_tool_calls(calls(*ids), now)
        elif kind == "finish":
            actions = session.worker_finished(finished_ok(), now)
        elif kind == "lost":
            actions = session.worker_lost(now)
        else:
            actions = session.timer(session.deadline if session.deadline is not None else now)
        after = session.execution_id
        for action in actions:
            if isinstance(action, StartRun):
                assert not worker_busy
                worker_busy = True
            elif isinstance(action, ReleaseWorker):
                worker_busy = False
            elif isinstance(action, SendToWorker) and isinstance(action.message, ipc.Settle):
                settled.append(action.message.call_id)
        messages = sent(actions)
        for message in messages:
            if message["type"] == "done":
                assert message["ok"] == ("error" not in message) and not ("result" in message and "error" in message)
        if before is None and after is not None:  # accepted: started comes first and alone
            assert messages == [{"type": "started", "id": after}]
            call_ids.clear()
        if before is not None and after is None:
            # The execution ended in this batch: its done is the last message, and the only one not rejecting another execute.
            assert messages[-1]["type"] == "done" and messages[-1]["id"] == before
            assert all(m["type"] == "tool_call" or m["error"]["code"] == "internal_error" for m in messages[:-1])
            if cancelled and event != ("execute", before):
                assert messages[-1]["error"] == {"code": "timeout", "message": "Execution timed out"}, event
            cancelled = False
        elif before is not None:
            # Still running: only tool_calls and rejections of other executes.
            for message in messages:
                assert message["type"] == "tool_call" or message["error"]["code"] == "internal_error"
        for message in messages:
            if message["type"] == "tool_call":
                assert before is not None and message["callId"] not in call_ids
                call_ids.add(message["callId"])
        if after is None:
            assert not worker_busy or session.phase.value == "closed"
    assert len(settled) == len(set(settled))


def test_log_limits_are_cut_to_whole_numbers_and_to_the_largest_kept() -> None:
    session = Session(max_output_bytes=6000)
    huge = {**OPTIONS, "maxLogLines": 2.0**64, "maxLogChars": 1e308}
    run = next(a.run for a in session.receive_text(execute("huge", options=huge), 0.0) if isinstance(a, StartRun))
    assert (run.max_log_lines, run.max_log_chars) == (1000, 1000)
    session = Session()
    small = {**OPTIONS, "maxLogLines": 2.9, "maxLogChars": 0.5}
    run = next(a.run for a in session.receive_text(execute("small", options=small), 0.0) if isinstance(a, StartRun))
    assert (run.max_log_lines, run.max_log_chars) == (2, 0)


def test_limits_above_the_operators_maximum_are_refused() -> None:
    session = Session(max_timeout_ms=1000, max_memory_limit_bytes=1 << 20)
    (done,) = sent(
        session.receive_text(execute("slow", options={**OPTIONS, "timeoutMs": 1001, "memoryLimitBytes": 1 << 20}), 0.0)
    )
    assert done["error"] == {
        "code": "validation_error",
        "message": "timeoutMs 1001 exceeds this runner's maximum of 1000",
    }
    for asked, written in ((999_999_999, "999999999"), (1e9, "1000000000"), (1000.5, "1000.5")):
        (done,) = sent(session.receive_text(execute("n", options={**OPTIONS, "timeoutMs": asked}), 0.0))
        assert done["error"]["message"] == f"timeoutMs {written} exceeds this runner's maximum of 1000"
    (done,) = sent(session.receive_text(execute("big", options={**OPTIONS, "memoryLimitBytes": (1 << 20) + 1}), 0.0))
    assert done["error"]["code"] == "validation_error" and "memoryLimitBytes" in done["error"]["message"]
    assert sent(
        session.receive_text(execute("fits", options={**OPTIONS, "timeoutMs": 1000, "memoryLimitBytes": 1 << 20}), 0.0)
    ) == [{"type": "started", "id": "fits"}]
