"""Guest-visible behaviour the spec leaves open, pinned to what execbox's reference runner does
(``benchmarks/differential.py`` finds the differences), over a real daemon."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from .daemonkit import Daemon, client, execute, receive, run_to_done, running_daemon


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon("--warm-workers", "1") as d:
        yield d


def logs_of(daemon: Daemon, code: str) -> list[str]:
    """The logs of ``code`` run to its ``done``, which must succeed."""
    with client(daemon.url) as ws:
        done = run_to_done(ws, "parity", code)
    assert done["ok"], done
    logs: list[str] = done["logs"]
    return logs


def run_with_failing_tool(daemon: Daemon, code: str, failure: dict[str, str]) -> dict[str, Any]:
    """The ``done`` of ``code``, whose one tool call the host answers with ``failure``."""
    with client(daemon.url) as ws:
        ws.send(execute("parity", code))
        assert receive(ws)["type"] == "started"
        call = receive(ws)
        ws.send(json.dumps({"type": "tool_result", "callId": call["callId"], "ok": False, "error": failure}))
        done: dict[str, Any] = receive(ws)
    assert done["type"] == "done" and done["ok"], done
    return done


def test_a_value_whose_json_is_a_string_logs_as_that_string_unquoted(daemon: Daemon) -> None:
    code = "console.log(new Date(0)); console.log('at', new String('s'), { d: new Date(0) })"
    assert logs_of(daemon, code) == ["1970-01-01T00:00:00.000Z", 'at s {"d":"1970-01-01T00:00:00.000Z"}']


def test_a_logged_error_shows_its_name_message_and_stack_after_its_own_properties(daemon: Daemon) -> None:
    code = """
    const coded = new RangeError('too far'); coded.code = 'E_FAR';
    class Mine extends Error {}
    console.log(coded); console.log('caught', new Mine('mine')); console.log({ nested: new Error('x') });
    """
    first, second, third = logs_of(daemon, code)
    coded = json.loads(first)
    assert list(coded) == ["code", "name", "message", "stack"]
    assert (coded["code"], coded["name"], coded["message"]) == ("E_FAR", "RangeError", "too far")
    assert "<input>" in coded["stack"]
    label, mine = second.split(" ", 1)
    assert (label, json.loads(mine)["message"]) == ("caught", "mine")
    assert third == '{"nested":{}}'  # as JSON has it: only the logged value itself is an error


def test_a_logged_tool_failure_keeps_the_hosts_message(daemon: Daemon) -> None:
    """Model-written code logs what it caught: the line shows the host's code and message."""
    code = "try { await tools.echo({}) } catch (e) { console.error(e) }"
    done = run_with_failing_tool(daemon, code, {"code": "validation_error", "message": "city is required"})
    line = json.loads(done["logs"][0])
    assert (line["code"], line["name"], line["message"]) == ("validation_error", "Error", "city is required")


def test_a_stack_shows_the_guests_frames_only(daemon: Daemon) -> None:
    """As the reference's: no frame of the runner's own code, which would change from release to
    release and tell the guest nothing; a refused tool input's stack starts where the guest called."""
    code = """
    function inner() { null.x }
    let thrown, refused;
    try { inner() } catch (e) { thrown = e.stack }
    try { await tools.echo(1n) } catch (e) { refused = e.stack }
    [thrown, refused]
    """
    with client(daemon.url) as ws:
        done = run_to_done(ws, "parity", code)
    thrown, refused = done["result"]
    assert thrown.splitlines()[0].startswith("    at inner (<input>:")
    assert all("(<input>:" in frame for frame in thrown.splitlines() + refused.splitlines())
    assert refused


def test_a_tool_failure_made_by_the_host_has_an_empty_stack(daemon: Daemon) -> None:
    code = "let r; try { await tools.echo({}) } catch (e) { r = [e.stack, e.message] } r"
    done = run_with_failing_tool(daemon, code, {"code": "tool_error", "message": "upstream down"})
    assert done["result"] == ["", "upstream down"]


def test_a_tool_failure_keeps_its_name_message_and_code_through_json_and_spreading(daemon: Daemon) -> None:
    """Model-written code passes on what it caught as ``JSON.stringify(e)`` or ``{ ...e }``: the
    host's message goes with it, as from the reference's errors; the guest-made copy is not trusted."""
    code = "let r; try { await tools.echo({}) } catch (e) { r = [Object.keys(e), JSON.stringify(e), { ...e }] } r"
    done = run_with_failing_tool(daemon, code, {"code": "not_found", "message": "no such city"})
    keys, text, spread = done["result"]
    assert keys == ["name", "message", "code"]
    assert json.loads(text) == spread == {"name": "Error", "message": "no such city", "code": "tool_error"}


def test_a_value_whose_getter_throws_is_not_serializable(daemon: Daemon) -> None:
    """As a result, uncaught, and as a tool input, which the guest can catch: no tool call goes out."""
    with client(daemon.url) as ws:
        result = run_to_done(ws, "parity", "({ get g() { throw new Error('getter failed') } })")
    assert (result["ok"], result["error"]) == (
        False,
        {
            "code": "serialization_error",
            "message": "Guest code returned a non-serializable value: reading it threw: getter failed",
        },
    )
    code = "let r; try { await tools.echo({ get g() { throw 'no' } }) } catch (e) { r = [e.code, e.message] } r"
    with client(daemon.url) as ws:
        caught = run_to_done(ws, "parity", code)
    assert caught["result"] == [
        "serialization_error",
        "Guest code passed a non-serializable tool input: reading it threw: no",
    ]
