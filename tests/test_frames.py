"""Hostile host frames: every frame gets a ``done`` or a documented close, at every
session state; never an exception, never a bare close. A second ``execute`` while
one runs, however its fields are mangled, gets its own ``done`` and leaves the
running execution alone.

Property tests drive the Sans-I/O session with generated frames; smaller ones,
and the regressions found by the red team, run over a real daemon.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from execbox_runner.protocol import ipc
from execbox_runner.protocol.session import (
    CloseTransport,
    Phase,
    SendToHost,
    SendToWorker,
    Session,
    StartRun,
)

from .daemonkit import Daemon, client, execute, receive, run_to_done, running_daemon

DOCUMENTED_CLOSES = {1003, 1007, 1008, 1009}
OPTIONS = {"timeoutMs": 5000, "memoryLimitBytes": 67108864, "maxLogLines": 100, "maxLogChars": 64000}
PROVIDERS = [{"name": "tools", "tools": {"echo": {"safeName": "echo"}, "hang": {"safeName": "hang"}}}]
DEEP = 100_000

# ---------------------------------------------------------------- frame generation
# Frames are built as text, so they can hold what no Python value serializes to:
# 100,000 levels of nesting, 1e400, lone surrogates, invalid UTF-8.

leaves = st.sampled_from(
    [b"null", b"true", b"0", b"-1.5", b"1e400", b"-1e400", str(2**64).encode(), b"1e-400", b'""', b'"e1"']
) | st.text(max_size=6).map(lambda t: json.dumps(t).encode())
surrogates = st.sampled_from([b'"\\ud83d"', b'"a\\udc00b"', b'"\\ud83d\\u0041"'])
invalid_utf8 = st.sampled_from([b'"\xff"', b'"\xed\xa0\xbd"', b'"\xc3"', b"\x80"])


def nested(depth: int, inner: bytes) -> bytes:
    return b"[" * depth + inner + b"]" * depth


def obj(fields: dict[str, bytes]) -> bytes:
    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in fields.items()) + b"}"


json_texts = st.recursive(
    leaves | surrogates,
    lambda children: (
        st.lists(children, max_size=3).map(lambda items: b"[" + b",".join(items) + b"]")
        | st.dictionaries(st.sampled_from(["type", "id", "a"]), children, max_size=3).map(obj)
    ),
    max_leaves=8,
)
json_values = json_texts | st.builds(nested, st.sampled_from([50, 1_200, 9_999, 10_001, DEEP]), json_texts)
any_value = json_values | invalid_utf8


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A host message whose fields may each be replaced, dropped or added to."""
    kind = draw(st.sampled_from(["execute", "cancel", "tool_result", "other"]))
    fields: dict[str, bytes] = {"type": json.dumps(kind).encode() if kind != "other" else draw(any_value)}
    if kind == "execute":
        fields |= {
            "id": draw(st.sampled_from([b'"e1"', b'"e2"'])),
            "code": b'"await tools.hang()"',
            "options": json.dumps(OPTIONS).encode(),
            "providers": json.dumps(PROVIDERS).encode(),
        }
        options = dict(OPTIONS)
        for name in draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=2)):
            fields["options"] = obj({**{k: json.dumps(v).encode() for k, v in options.items()}, name: draw(any_value)})
    elif kind == "cancel":
        fields["id"] = b'"e1"'
    elif kind == "tool_result":
        fields |= {"callId": b'"call-1"', "ok": draw(st.sampled_from([b"true", b"false"]))}
        if draw(st.booleans()):
            fields["result"] = draw(any_value)
        if fields["ok"] == b"false":
            fields["error"] = obj({"code": b'"tool_error"', "message": draw(st.sampled_from([b'"no"', b'"\\ud83d"']))})
    for name in draw(st.lists(st.sampled_from(["type", "id", "code", "callId", "ok", "result", "x"]), max_size=2)):
        fields[name] = draw(any_value)
    frame = obj(fields)
    return draw(st.sampled_from([frame, frame[:-1], frame + b"x"])) if draw(st.integers(0, 9)) == 0 else frame


# Ids a second execute may carry: well-formed strings other than the running execution's ("e1").
other_ids = st.sampled_from(["e2", "", "e1 ", "E1", "é", "\u0000", "x" * 300]) | st.text(max_size=8).filter(
    lambda text: text != "e1"
)


@st.composite
def second_executes(draw: st.DrawFn) -> tuple[str, bytes]:
    """An ``execute`` with an id of its own, whose other fields may each be replaced (by any JSON,
    nested up to 100,000 deep, with lone surrogates, 1e400), dropped, or added to; the options'
    fields too. Text that is not UTF-8 is left out: that is a broken frame, not an execute
    (close 1007, as any other)."""
    exec_id = draw(other_ids)
    options = {name: json.dumps(value).encode() for name, value in OPTIONS.items()}
    for name in draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=4)):
        if draw(st.booleans()):
            options[name] = draw(json_values)
        else:
            options.pop(name, None)
    fields: dict[str, bytes] = {
        "type": b'"execute"',
        "id": json.dumps(exec_id).encode(),
        "code": draw(st.sampled_from([b'"1"', b'"await tools.hang()"', b'"\\ud83d"'])),
        "options": obj(options),
        "providers": json.dumps(PROVIDERS).encode(),
    }
    for name in draw(st.lists(st.sampled_from(["code", "options", "providers", "x"]), max_size=3)):
        if draw(st.booleans()):
            fields[name] = draw(json_values)
        else:
            fields.pop(name, None)
    return exec_id, obj(fields)


# ---------------------------------------------------------------- the Sans-I/O invariant

STATES = ["idle", "running", "awaiting_tool", "aborting", "after_done"]


def session_in(state: str) -> Session:
    session = Session()
    if state == "idle":
        return session
    message = {"type": "execute", "id": "e1", "code": "1", "options": OPTIONS, "providers": PROVIDERS}
    session.receive_text(json.dumps(message).encode(), 0.0)
    if state in ("awaiting_tool", "aborting"):
        session.worker_tool_calls(ipc.ToolCalls(calls=[(1, "tools", "echo", b"1")], logs=[]), 0.0)
    if state == "aborting":
        session.receive_text(b'{"type":"cancel","id":"e1"}', 0.0)
    if state == "after_done":
        session.worker_finished(ipc.Finished(ok=True, result=b"1", code=None, message="", logs=[]), 0.0)
    return session


def dones(actions: list[Any], exec_id: str) -> int:
    messages = [json.loads(a.data) for a in actions if isinstance(a, SendToHost)]  # every frame is JSON
    return sum(m["type"] == "done" and m["id"] == exec_id for m in messages)


def check_frame(state: str, frame: bytes) -> None:
    session = session_in(state)
    active = session.execution_id
    actions = session.receive_text(frame, 0.1)
    for action in actions:  # what goes to a worker can be encoded for it
        if isinstance(action, StartRun):
            ipc.frame(0, action.run)
        elif isinstance(action, SendToWorker):
            ipc.frame(0, action.message)
    closes = [a for a in actions if isinstance(a, CloseTransport)]
    if session.phase is Phase.CLOSED:
        assert [c.code for c in closes] in ([c] for c in DOCUMENTED_CLOSES), closes
        assert active is None or dones(actions, active) == 1
        assert isinstance(actions[-1], CloseTransport)
        return
    assert not closes
    if active is not None and session.execution_id != active:
        assert dones(actions, active) == 1  # ended by this frame: its one done
    elif active is not None:
        assert dones(actions, active) == 0
        if session.phase is Phase.RUNNING:  # and it still ends with exactly one done
            session.receive_text(b'{"type":"cancel","id":"e1"}', 0.2)
        ended = session.worker_lost(0.3)
        assert dones(ended, active) == 1
        assert session.execution_id is None
    # The session is usable: a fresh execute is started.
    message = {"type": "execute", "id": "again", "code": "1", "options": OPTIONS, "providers": PROVIDERS}
    after = session.receive_text(json.dumps(message).encode(), 0.4)
    if session.execution_id == "again":
        assert any(isinstance(a, StartRun) for a in after)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(STATES), frames())
def test_any_frame_at_any_state_gets_one_done_then_a_usable_session_or_a_documented_close(
    state: str, frame: bytes
) -> None:
    check_frame(state, frame)


def check_second_execute(state: str, second: str, frame: bytes) -> None:
    """The specification's rule: a second ``execute`` (id ``second``) while one is active gets its own
    terminal ``done`` (``internal_error``); the active execution goes on and ends with exactly one ``done``."""
    session = session_in(state)
    actions = session.receive_text(frame, 0.1)
    assert not [a for a in actions if isinstance(a, CloseTransport | StartRun | SendToWorker)], actions
    answers = [json.loads(a.data) for a in actions if isinstance(a, SendToHost)]
    assert [(m["type"], m["id"], m["error"]["code"]) for m in answers] == [("done", second, "internal_error")]
    assert session.execution_id == "e1" and session.phase is Phase.RUNNING
    ended: list[Any] = []
    if state == "awaiting_tool":  # its tool call is still answered
        settled = session.receive_text(b'{"type":"tool_result","callId":"call-1","ok":true,"result":2}', 0.2)
        assert [a.message.call_id for a in settled if isinstance(a, SendToWorker)] == [1]
    ended += session.worker_finished(ipc.Finished(ok=True, result=b"3", code=None, message="", logs=["x"]), 0.3)
    assert dones(ended, "e1") == 1 and session.execution_id is None
    (done,) = [json.loads(a.data) for a in ended if isinstance(a, SendToHost)]
    assert (done["ok"], done["result"], done["logs"]) == (True, 3, ["x"])


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.sampled_from(["running", "awaiting_tool"]), second_executes())
def test_a_second_execute_with_any_fields_gets_its_own_done_and_the_active_one_goes_on(
    state: str, second: tuple[str, bytes]
) -> None:
    check_second_execute(state, *second)


@pytest.mark.parametrize("state", STATES)
@pytest.mark.parametrize(
    "frame",
    [
        nested(DEEP, b""),
        b'{"type":"cancel","id":' + nested(DEEP, b"") + b"}",
        b'{"type":"execute","id":"e2","code":"1","options":' + nested(DEEP, b"") + b',"providers":[]}',
        b'{"type":"tool_result","callId":"call-1","ok":true,"result":' + nested(DEEP, b"") + b"}",
        b'{"type":{}}',
        b'{"type":[null,1]}',
        b'{"type":"execute","id":"e2","code":1,"x":1e400}',
        b'{"type":"cancel","id":"\xff"}',
        json.dumps({"type": "execute", "id": "e2", "code": "1", "options": {**OPTIONS, "maxLogLines": 2**64}}).encode(),
        b'{"type":"execute","id":"e2","code":"1","options":{"timeoutMs":1e400,"memoryLimitBytes":1,"maxLogLines":1,"maxLogChars":1},"providers":[]}',
        b'{"type":"execute","id":"e1","code":"1","options":' + json.dumps(OPTIONS).encode() + b',"providers":[]}',
        b'{"type":"tool_result","callId":"call-1","ok":false,"error":{"code":"x","message":"\\ud83d"}}',
    ],
)
def test_the_red_team_frames(state: str, frame: bytes) -> None:
    check_frame(state, frame)


# ---------------------------------------------------------------- over a real socket


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


@contextlib.contextmanager
def awaiting_hang(d: Daemon) -> Iterator[ClientConnection]:
    with client(d.url) as ws:
        ws.send(execute("e1", "await tools.hang()"))
        assert receive(ws)["type"] == "started"
        assert receive(ws)["type"] == "tool_call"
        yield ws


def answer_to(ws: ClientConnection, frame: bytes) -> tuple[list[dict[str, Any]], int | None]:
    """What the daemon sends after ``frame``: its messages until a done for e1 or
    a quiet moment, and the close code (None: still open); a bare close fails."""
    ws.send(frame, text=True)
    messages: list[dict[str, Any]] = []
    try:
        while len(messages) < 10:
            messages.append(receive(ws, timeout=1.0))
    except TimeoutError:
        return messages, None
    except ConnectionClosed as closed:
        assert closed.rcvd is not None, "a bare TCP close"
        return messages, closed.rcvd.code
    raise AssertionError(f"unexpected traffic: {messages}")


@pytest.mark.parametrize(
    ("frame", "close"),
    [
        (nested(DEEP, b""), 1008),
        (b'{"type":"cancel","id":' + nested(DEEP, b"") + b"}", 1008),
        (b'{"type":"tool_result","callId":"call-1","ok":true,"result":' + nested(DEEP, b"") + b"}", 1008),
        (b'{"type":{}}', 1008),
        (b'{"type":[null,1]}', 1008),
        (b'{"type":"cancel","id":"\xff"}', 1007),
    ],
)
def test_a_hostile_frame_mid_execution_gets_done_then_a_close(daemon: Daemon, frame: bytes, close: int) -> None:
    with awaiting_hang(daemon) as ws:
        messages, code = answer_to(ws, frame)
    assert [m["id"] for m in messages if m["type"] == "done"] == ["e1"]
    assert code == close
    with client(daemon.url) as other:  # the daemon carries on
        assert run_to_done(other, "x", "1 + 1")["result"] == 2


def test_json_nested_100000_deep_on_an_idle_session_is_a_policy_close(daemon: Daemon) -> None:
    """Within the size limit, too deep is a bad message (1008), not a message too big (1009)."""
    with client(daemon.url) as ws:
        messages, code = answer_to(ws, nested(DEEP, b""))
    assert (messages, code) == ([], 1008)


@pytest.mark.parametrize(
    "frame",
    [
        b'{"type":"execute","id":"e2","code":1,"x":1e400}',
        b'{"type":"execute","id":"e2","code":"1","options":' + nested(DEEP, b"") + b',"providers":[]}',
        b'{"type":"execute","id":"e2","code":"1","options":{},"providers":[],"x":' + nested(20_000, b"1") + b"}",
    ],
)
def test_a_broken_second_execute_gets_its_own_done(daemon: Daemon, frame: bytes) -> None:
    with awaiting_hang(daemon) as ws:
        messages, code = answer_to(ws, frame)
        assert code is None
        assert [(m["type"], m["id"], m["error"]["code"]) for m in messages] == [("done", "e2", "internal_error")]
        ws.send(json.dumps({"type": "tool_result", "callId": "call-1", "ok": True, "result": 7}))
        assert receive(ws)["result"] == 7


def test_an_execute_nested_too_deeply_gets_a_validation_error_done(daemon: Daemon) -> None:
    frame = b'{"type":"execute","id":"e1","code":"1","options":' + nested(DEEP, b"") + b',"providers":[]}'
    with client(daemon.url) as ws:
        messages, code = answer_to(ws, frame)
        assert code is None
        (done,) = messages
        assert (done["id"], done["error"]["code"]) == ("e1", "validation_error")
        assert "nested deeper than 10000 levels" in done["error"]["message"]
        assert run_to_done(ws, "e2", "3")["result"] == 3


@pytest.mark.parametrize("options", [{"timeoutMs": 1e400}, {"maxLogLines": -1}, {"maxLogChars": 1e400}])
def test_limits_out_of_range_are_a_validation_error(daemon: Daemon, options: dict[str, Any]) -> None:
    frame = execute("e1", "1", **options).replace("Infinity", "1e400")
    with client(daemon.url) as ws:
        ws.send(frame)
        done = receive(ws)
        assert (done["type"], done["error"]["code"]) == ("done", "validation_error")
        assert run_to_done(ws, "e2", "3")["result"] == 3


@pytest.mark.parametrize("name", ["undefined", "NaN", "Infinity"])
def test_a_provider_named_after_a_global_javascript_fixes_is_refused(daemon: Daemon, name: str) -> None:
    """Each provider becomes a guest global, which these three cannot be: the execute is refused, saying
    why, instead of failing every execution with runtime_error "property is not configurable"."""
    frame = json.loads(execute("e1", "1"))
    frame["providers"] = [{"name": name, "tools": {"t": {"safeName": "t"}}}]
    with client(daemon.url) as ws:
        ws.send(json.dumps(frame))
        done = receive(ws)
        assert (done["type"], done["error"]["code"]) == ("done", "validation_error")
        assert (
            f"a provider cannot be named {name}: JavaScript's global {name} cannot be replaced"
            in done["error"]["message"]
        )
        assert run_to_done(ws, "e2", "3")["result"] == 3


@pytest.mark.parametrize(
    "limit", ["4294967296", "9007199254740991", "9223372036854775808", "1e+21", "1.7976931348623157e+308"]
)
def test_any_log_limit_a_javascript_host_writes_works_as_the_largest_kept(daemon: Daemon, limit: str) -> None:
    """Hosts pass huge limits (Number.MAX_SAFE_INTEGER and beyond) to mean "no limit": nothing is lost."""
    code = "for (let i = 0; i < 3; i++) console.log('line', i); 7"
    for options in ({"maxLogLines": 0}, {"maxLogChars": 0}, {"maxLogLines": 0, "maxLogChars": 0}):
        frame = execute("e1", code, **options)
        for name in options:
            frame = frame.replace(f'"{name}": 0', f'"{name}": {limit}')
        with client(daemon.url) as ws:
            ws.send(frame)
            assert receive(ws)["type"] == "started"
            done = receive(ws)
        assert (done["result"], done["logs"]) == (7, ["line 0", "line 1", "line 2"]), (limit, options)


@pytest.mark.parametrize(("spelling", "limit"), [("67108864.0", 67108864), ("1e8", 100000000), ("6.4e5", 640000)])
def test_a_whole_memory_limit_is_taken_in_any_json_spelling(daemon: Daemon, spelling: str, limit: int) -> None:
    """JavaScript has one number type, and JSON Schema's "integer" takes 67108864.0: a host whose encoder
    writes a whole memoryLimitBytes with a fraction or an exponent (Python's json, serde_json for an
    f64) gets the limit it means. A fraction is still refused, naming the field."""
    frame = execute("e1", "const a = []; while (true) a.push([a.length])", memoryLimitBytes=0)
    with client(daemon.url) as ws:
        ws.send(frame.replace('"memoryLimitBytes": 0', f'"memoryLimitBytes": {spelling}'))
        assert receive(ws)["type"] == "started"
        assert receive(ws)["error"] == {"code": "memory_limit", "message": "Memory limit exceeded"}
        ws.send(frame.replace('"memoryLimitBytes": 0', f'"memoryLimitBytes": {limit - 0.5}'))
        refused = receive(ws)["error"]
    assert refused["code"] == "validation_error" and refused["message"].endswith("at `$.options.memoryLimitBytes`")


def test_a_fractional_log_limit_counts_whole_lines_and_characters(daemon: Daemon) -> None:
    with client(daemon.url) as ws:
        done = run_to_done(ws, "e1", "console.log('abc'); console.log('def'); console.log('g')", maxLogLines=2.9)
        assert done["logs"] == ["abc", "def"]
        done = run_to_done(ws, "e2", "console.log('abc'); console.log('def')", maxLogChars=4.5)
        assert done["logs"] == ["abc", "d"]


def test_a_tool_result_1200_deep_with_lone_surrogates_reaches_the_guest(daemon: Daemon) -> None:
    value = nested(1_200, b'"\\ud83d"')
    code = "const v = await tools.hang(); let d = 0, x = v; while (Array.isArray(x)) { x = x[0]; d++ } [d, x.length, x.charCodeAt(0)]"
    with client(daemon.url) as ws:
        ws.send(execute("e1", code))
        assert receive(ws)["type"] == "started"
        call = receive(ws)
        ws.send(
            b'{"type":"tool_result","callId":"' + call["callId"].encode() + b'","ok":true,"result":' + value + b"}",
            text=True,
        )
        assert receive(ws)["result"] == [1_200, 1, 0xD83D]


def test_a_failing_tool_result_message_with_a_lone_surrogate_reaches_the_guest_unchanged(daemon: Daemon) -> None:
    """As ``JSON.stringify`` of a split emoji sends it: the guest's error message holds the same code units."""
    code = "let r; try { await tools.hang() } catch (e) { r = [e.code, e.message.length, e.message.charCodeAt(1)] } r"
    with client(daemon.url) as ws:
        ws.send(execute("e1", code))
        assert receive(ws)["type"] == "started"
        call = receive(ws)
        error = b'{"code":"tool_error","message":"a\\ud83db"}'
        ws.send(
            b'{"type":"tool_result","callId":"' + call["callId"].encode() + b'","ok":false,"error":' + error + b"}",
            text=True,
        )
        assert receive(ws)["result"] == ["tool_error", 3, 0xD83D]


def test_a_second_execute_with_the_active_id_ends_it(daemon: Daemon) -> None:
    """A done is the last word for its id: nothing of the first execution follows it."""
    with awaiting_hang(daemon) as ws:
        ws.send(execute("e1", "await tools.echo(1); await tools.echo(2)"))
        done = receive(ws)
        assert (done["type"], done["id"], done["error"]["code"]) == ("done", "e1", "internal_error")
        ws.send(json.dumps({"type": "tool_result", "callId": "call-1", "ok": True, "result": 1}))
        ws.send(execute("e2", "5"))
        after = [receive(ws) for _ in range(2)]
        assert [(m["type"], m["id"], m.get("result")) for m in after] == [("started", "e2", None), ("done", "e2", 5)]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(second=second_executes())
def test_a_second_execute_over_a_socket_gets_its_own_done_and_the_active_one_goes_on(
    daemon: Daemon, second: tuple[str, bytes]
) -> None:
    exec_id, frame = second
    with awaiting_hang(daemon) as ws:
        messages, code = answer_to(ws, frame)
        assert code is None
        assert [(m["type"], m["id"], m["error"]["code"]) for m in messages] == [("done", exec_id, "internal_error")]
        ws.send(json.dumps({"type": "tool_result", "callId": "call-1", "ok": True, "result": 7}))
        done = receive(ws)
        assert (done["type"], done["id"], done["result"]) == ("done", "e1", 7)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
@given(frame=frames())
def test_any_frame_over_a_socket_gets_a_done_and_a_documented_close_or_a_usable_session(
    daemon: Daemon, frame: bytes
) -> None:
    with awaiting_hang(daemon) as ws, client(daemon.url) as other:
        other.send(execute("o1", "await tools.echo(1)"))
        assert receive(other)["type"] == "started"
        messages, code = answer_to(ws, frame)
        assert sum(m["type"] == "done" and m["id"] == "e1" for m in messages) <= 1
        assert code is None or code in DOCUMENTED_CLOSES
        if code is not None:
            assert [m["id"] for m in messages if m["type"] == "done"][-1:] == ["e1"]
        call = receive(other)  # the other session is untouched
        other.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": True, "result": 4}))
        assert receive(other)["result"] == 4
