"""Code mode for MCP, over real processes: an MCP server written here with the SDK, wrapped as a
provider, and ``execbox-runner mcp`` driven by the SDK's own client over stdio and streamable HTTP.

Everything listens on 127.0.0.1 and every wait is bounded.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("mcp")
import mcp_types
from mcp import Client, StdioServerParameters

from execbox_runner import __version__
from execbox_runner.client import Providers, Runner, Tool
from execbox_runner.mcp.codemode import Bounds, CodeMode
from execbox_runner.mcp.config import UpstreamServer
from execbox_runner.mcp.provider import mcp_tools, result_json
from execbox_runner.mcp.upstream import connect_upstreams

from .daemonkit import Daemon, children_of, process_state, running_daemon

UPSTREAM = '''
import sys
import time
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("upstream")

@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b

@server.tool(name="slow-echo")
def slow_echo(text: str, seconds: float = 0.0) -> str:
    """Echo text after sleeping (a hung tool with a large `seconds`)."""
    time.sleep(seconds)
    return text

@server.tool()
def explode(reason: str) -> str:
    """Always fails."""
    raise ToolError(f"exploded: {reason}")  # the message an MCP client sees

if len(sys.argv) > 1:  # a port: serve streamable HTTP on loopback
    server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[1]))
else:
    server.run()
'''


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon() as started:
        yield started


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> StdioServerParameters:
    script = tmp_path_factory.mktemp("mcp") / "upstream.py"
    script.write_text(UPSTREAM)
    return StdioServerParameters(command=sys.executable, args=[str(script)])


@pytest.fixture(scope="module")
def servers_json(tmp_path_factory: pytest.TempPathFactory, upstream: StdioServerParameters) -> Path:
    config = tmp_path_factory.mktemp("mcp") / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"demo-server": {"command": upstream.command, "args": upstream.args}}}))
    return config


def run(main: Any) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(60):  # no test waits unbounded on a child process
            return await main()

    return anyio.run(bounded)


EXPLODED = "Error executing tool explode: exploded: on purpose"  # the server's message, as MCPServer words it
THREE_TOOLS = """
const sum = await upstream.add({a: 2, b: 40});
const echoed = await upstream.slow_echo({text: "hi"});
let caught;
try { await upstream.explode({reason: "on purpose"}); } catch (e) { caught = e.message; }
console.log("done");
({sum, echoed, caught})
"""


def test_an_mcp_server_is_a_provider(daemon: Daemon, upstream: StdioServerParameters) -> None:
    async def main() -> tuple[Any, str]:
        async with Client(upstream) as client:
            providers = Providers({"upstream": await mcp_tools(client.session)})
            result = await Runner.connect(daemon.url).execute(THREE_TOOLS, providers)
            wrong = await Runner.connect(daemon.url).execute("await upstream.add({a: 'x'})", providers)
            assert wrong.error is not None and wrong.error.code == "validation_error"  # checked before the call
            return result, providers.types

    result, types = run(main)
    assert result.ok, result.error
    assert result.result == {"sum": {"result": 42}, "echoed": {"result": "hi"}, "caught": EXPLODED}
    assert result.logs == ["done"]
    assert "function add(input: {\n    a: number;\n    b: number;\n  }): Promise<{\n    result: number;\n  }>;" in types
    assert "function slow_echo(input:" in types and "Add two numbers." in types


def test_servers_over_streamable_http_and_stdio_are_namespaces(daemon: Daemon, upstream: StdioServerParameters) -> None:
    port = free_port()
    with listening([upstream.command, *upstream.args, str(port)], port):
        servers = {
            "web-up": UpstreamServer(url=f"http://127.0.0.1:{port}/mcp", headers={"X-Test": "1"}),
            "local": UpstreamServer(command=upstream.command, args=upstream.args),
        }
        both = (
            "const [web, stdio] = await Promise.all([web_up.add({a: 2, b: 40}), local.add({a: 1, b: 2})]); [web, stdio]"
        )

        async def main() -> Any:
            async with connect_upstreams(servers) as sessions:
                tools = {name: await mcp_tools(session) for name, session in sessions.items()}
                return await CodeMode(Runner.connect(daemon.url), tools).execute_code(both)

        executed = run(main)
    assert executed.structured_content["result"] == [{"result": 42}, {"result": 3}]


def test_a_hung_upstream_tool_is_the_executions_timeout(daemon: Daemon, upstream: StdioServerParameters) -> None:
    async def main() -> tuple[Any, Any, float]:
        async with Client(upstream) as client:
            code_mode = CodeMode(Runner.connect(daemon.url), {"up": await mcp_tools(client.session)}, Bounds(1000))
            started = time.monotonic()
            hung = await code_mode.execute_code("await up.slow_echo({text: 'x', seconds: 3600})")
            elapsed = time.monotonic() - started
            after = await code_mode.execute_code("await up.add({a: 1, b: 1})")
            return hung, after, elapsed

    hung, after, elapsed = run(main)
    assert hung.is_error and hung.structured_content["error"]["code"] == "timeout"
    assert elapsed < 5
    assert after.structured_content == {"ok": True, "result": {"result": 2}, "error": None, "logs": []}


CRASHING = """
import os
from mcp.server import MCPServer

server = MCPServer("crashing")

@server.tool()
def ping() -> str:
    return "pong"

@server.tool()
def crash() -> str:
    os._exit(1)

server.run()
"""


def test_a_crashed_upstream_is_a_tool_error(daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING)

    async def main() -> list[Any]:
        async with Client(StdioServerParameters(command=sys.executable, args=[str(script)])) as client:
            code_mode = CodeMode(Runner.connect(daemon.url), {"c": await mcp_tools(client.session, call_timeout=5)})
            codes = ["await c.ping()", "await c.crash()", "await c.ping().catch(() => 'caught')"]
            return [(await code_mode.execute_code(code)).structured_content for code in codes]

    pinged, crashed, after = run(main)
    assert pinged["result"] == {"result": "pong"}  # no input: the tool takes none
    assert crashed["error"]["code"] == "tool_error" and after["result"] == "caught"


def test_a_wrapped_server_that_goes_away_mid_call_fails_its_own_tools_only(
    daemon: Daemon, upstream: StdioServerParameters, tmp_path: Path
) -> None:
    """A wrapped HTTP server killed while a program calls it: that call and the later ones of its tools
    are tool errors saying it is gone; the other servers' tools, and code mode, go on."""
    port = free_port()
    config = tmp_path / "servers.json"
    web, local = {"url": f"http://127.0.0.1:{port}/mcp"}, {"command": upstream.command, "args": upstream.args}
    config.write_text(json.dumps({"mcpServers": {"web": web, "local": local}}))
    argv = command(config, daemon)
    with listening([upstream.command, *upstream.args, str(port)], port) as web_server:

        async def kill_the_server(done: float, total: float | None, message: str | None) -> None:
            if message == "calling web.slow_echo":
                web_server.kill()

        async def main() -> list[Any]:
            async with Client(StdioServerParameters(command=argv[0], args=argv[1:])) as client:
                killed = await client.call_tool(
                    "execute_code",
                    {"code": "await web.slow_echo({text: 'x', seconds: 30})"},
                    progress_callback=kill_the_server,
                )
                codes = ["await web.add({a: 1, b: 2})", "await local.add({a: 1, b: 3})"]
                return [killed, *[await client.call_tool("execute_code", {"code": code}) for code in codes]]

        killed, later, other = run(main)
    gone = "its MCP server closed the connection (it exited or went away); restart code mode to reconnect"
    assert killed.is_error and later.is_error
    assert killed.structured_content["error"] == {
        "code": "tool_error",
        "message": f"Tool slow-echo is unavailable: {gone}",
    }
    assert later.structured_content["error"] == {"code": "tool_error", "message": f"Tool add is unavailable: {gone}"}
    assert other.structured_content["result"] == {"result": 4}


def test_bounds_on_tool_calls_and_result_size(daemon: Daemon, upstream: StdioServerParameters) -> None:
    async def main() -> tuple[Any, Any, str]:
        async with Client(upstream) as client:
            tools = {"up": await mcp_tools(client.session)}
            code_mode = CodeMode(Runner.connect(daemon.url), tools, Bounds(max_tool_calls=2, max_result_chars=300))
            calls = await code_mode.execute_code("for (let i = 0; i < 3; i++) await up.add({a: i, b: i})")
            big = await code_mode.execute_code("'x'.repeat(10000)")
            return calls, big, code_mode.search_tools("echo")

    calls, big, found = run(main)
    assert calls.structured_content["error"] == {
        "code": "tool_error",
        "message": "Tool call limit reached (2 per execution)",
    }
    assert big.structured_content is None and not big.is_error
    assert len(big.content[0].text) < 400 and big.content[0].text.endswith("characters left out]")
    assert "function slow_echo(" in found and "function add(" not in found


def double(n: int) -> int:
    """Double a number."""
    return 2 * n


async def shout(text: str) -> str:
    return text.upper()


def test_code_mode_takes_python_tools_beside_mcp_ones(daemon: Daemon, upstream: StdioServerParameters) -> None:
    both = "[await py.double({n: 21}), await py.shout({text: 'hi'}), (await up.add({a: 1, b: 2})).result]"

    async def main() -> tuple[str, Any, Any]:
        async with Client(upstream) as client:
            tools = {
                "up": await mcp_tools(client.session),
                "py": {"double": double, "shout": Tool(shout, description="Upper-case text.")},
            }
            code_mode = CodeMode(Runner.connect(daemon.url), tools, Bounds(max_tool_calls=3))
            ran = await code_mode.execute_code(both)
            over = await code_mode.execute_code(  # refused calls count too
                "const codes = []; for (let i = 0; i < 4; i++) codes.push(await py.double({n: 'x'}).catch((e) => e.code)); codes"
            )
            return code_mode.search_tools("double shout"), ran, over

    found, ran, over = run(main)
    assert "Double a number." in found and "function double(input: {\n    n: number;\n  }): Promise<number>;" in found
    assert "Upper-case text." in found and "function shout(input: {\n    text: string;\n  }): Promise<string>;" in found
    assert ran.structured_content == {"ok": True, "result": [42, "HI", 3], "error": None, "logs": []}
    assert over.structured_content["result"] == ["validation_error"] * 3 + ["tool_error"]


WALKTHROUGH = """
for (const [title, text] of [["monday", "buy milk"], ["tuesday", "call Ada"]]) {
  await notes.add_note({title, text});
}
const titles = (await notes.list_notes()).result;
console.log(`${titles.length} notes`);
const missing = await notes.read_note({title: "friday"}).catch((e) => e.message);
({titles, missing})
"""


def test_the_readme_walkthrough(daemon: Daemon) -> None:
    """README, "Code mode for MCP": the notes example gives what the walkthrough shows."""
    notes = Path(__file__).resolve().parent.parent / "examples" / "mcp_notes_server.py"

    async def main() -> tuple[str, Any]:
        async with Client(StdioServerParameters(command=sys.executable, args=[str(notes)])) as client:
            code_mode = CodeMode(Runner.connect(daemon.url), {"notes": await mcp_tools(client.session)})
            return code_mode.search_tools("note"), await code_mode.execute_code(WALKTHROUGH)

    found, executed = run(main)
    assert found.startswith("// 3 of 3 tools;") and "function add_note(input: {" in found
    assert executed.content[0].text == (
        '{"ok": true, "result": {"titles": ["monday", "tuesday"], "missing": "Error executing tool read-note: '
        'no note titled \'friday\'"}, "error": null, "logs": ["2 notes"]}'
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def code_mode_session(client: Client) -> list[mcp_types.CallToolResult]:
    """What an MCP client does with code mode: list the two tools, search, run code."""
    assert client.server_info is not None  # it says which server it is, and of which version
    assert (client.server_info.name, client.server_info.version) == ("execbox-code-mode", __version__)
    listed = await client.list_tools()
    assert sorted(tool.name for tool in listed.tools) == ["execute_code", "search_tools"]
    found = await client.call_tool("search_tools", {"query": "add numbers"})
    every = await client.call_tool("search_tools", {})  # no query: every tool, as its description says
    executed = await client.call_tool("execute_code", {"code": THREE_TOOLS.replace("upstream.", "demo_server.")})
    failed = await client.call_tool("execute_code", {"code": "throw new Error('no')"})
    return [found, every, executed, failed]


def check_code_mode(results: list[mcp_types.CallToolResult]) -> None:
    found, every, executed, failed = results
    assert "declare namespace demo_server" in found.content[0].text and "function add(" in found.content[0].text
    assert not every.is_error and "function add(" in every.content[0].text
    body = json.loads(executed.content[0].text)
    assert body["ok"] and body["result"]["caught"] == EXPLODED and body["logs"] == ["done"]
    assert body["result"]["sum"] == {"result": 42}
    assert failed.is_error and json.loads(failed.content[0].text)["error"]["code"] == "runtime_error"


def command(servers_json: Path, daemon: Daemon, *extra: str) -> list[str]:
    return [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(servers_json), "--url", daemon.url, *extra]


def test_code_mode_over_stdio(daemon: Daemon, servers_json: Path) -> None:
    argv = command(servers_json, daemon)
    server = StdioServerParameters(command=argv[0], args=argv[1:])

    async def main() -> list[mcp_types.CallToolResult]:
        async with Client(server) as client:
            return await code_mode_session(client)

    check_code_mode(run(main))


@contextlib.contextmanager
def listening(argv: list[str], port: int) -> Iterator[subprocess.Popen[str]]:
    """Run ``argv`` until it accepts connections on ``port`` (30 s at most); stop it by PID afterwards."""
    with tempfile.TemporaryFile(mode="w+") as output:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=output, text=True)
        try:
            deadline = time.monotonic() + 30
            while True:
                assert process.poll() is None, output.seek(0) or output.read()
                assert time.monotonic() < deadline, f"{argv} did not listen in 30 s"
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def test_code_mode_over_streamable_http(daemon: Daemon, servers_json: Path) -> None:
    port = free_port()
    with listening(command(servers_json, daemon, "--transport", "http", "--port", str(port)), port):

        async def main() -> list[mcp_types.CallToolResult]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return await code_mode_session(client)

        check_code_mode(run(main))


def test_sigterm_stops_the_local_runner_and_the_wrapped_servers(servers_json: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(servers_json), "--transport", "http"]
    with listening([*argv, "--port", str(port)], port) as process:
        children = children_of(process.pid)
        assert len(children) == 2  # the private runner (Runner.local()) and the wrapped stdio server
        process.terminate()
        assert process.wait(timeout=30) == 0
    assert [process_state(pid) for pid in children] == ["gone", "gone"]


WAITING = '''
import anyio

@server.tool()
async def wait_forever(record: str) -> str:
    """Waits until cancelled, and writes down that it was."""
    try:
        await anyio.sleep_forever()
    finally:
        with open(record, "w") as file:
            file.write("cancelled")
    return "never"

'''


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["initialize handshake", "stateless"])
def test_a_cancelled_request_cancels_the_execution_and_its_tool_calls(
    daemon: Daemon, tmp_path: Path, mode: str
) -> None:
    """The MCP client gives up on execute_code (notifications/cancelled): the program ends, and the
    wrapped tool it waits on is cancelled too, long before the execution's time is up."""
    script = tmp_path / "waiting.py"
    script.write_text(UPSTREAM.replace("if len(sys.argv) > 1:", WAITING + "if len(sys.argv) > 1:"))
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"up": {"command": sys.executable, "args": [str(script)]}}}))
    argv = command(config, daemon, "--timeout-ms", "300000")
    record = tmp_path / "record"

    async def main() -> Any:
        async with Client(StdioServerParameters(command=argv[0], args=argv[1:]), mode=mode) as client:
            calling = anyio.Event()

            async def progress(done: float, total: float | None, message: str | None) -> None:
                if message == "calling up.wait_forever":
                    calling.set()

            async def give_up() -> None:
                await calling.wait()
                tasks.cancel_scope.cancel()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(give_up)
                code = f"await up.wait_forever({{record: {json.dumps(str(record))}}})"
                await client.call_tool("execute_code", {"code": code}, progress_callback=progress)
            with anyio.fail_after(30):
                while not record.exists():
                    await anyio.sleep(0.05)
            return (await client.call_tool("execute_code", {"code": "'still serving'"})).structured_content

    after = run(main)
    assert record.read_text() == "cancelled" and after["result"] == "still serving"


def test_a_private_runner_that_dies_is_started_again(servers_json: Path) -> None:
    """The private runner killed between two calls: the next execute_code starts another and runs
    (before, every call failed with runner_unavailable until code mode was restarted); SIGTERM
    still stops them all."""
    port = free_port()
    argv = [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(servers_json), "--transport", "http"]
    with listening([*argv, "--port", str(port)], port) as process:

        def runners() -> list[int]:
            return [pid for pid in children_of(process.pid) if b"serve" in Path(f"/proc/{pid}/cmdline").read_bytes()]

        async def main() -> list[Any]:
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                first = await client.call_tool("execute_code", {"code": "1"})
                (runner,) = runners()
                os.kill(runner, signal.SIGKILL)
                second = await client.call_tool("execute_code", {"code": "2"})
                return [first.structured_content, second.structured_content, runner]

        first, second, killed = run(main)
        restarted = runners()
        children = children_of(process.pid)
        process.terminate()
        assert process.wait(timeout=30) == 0
    assert first["result"] == 1 and second["ok"], second
    assert second["result"] == 2 and len(restarted) == 1 and restarted != [killed]
    assert [process_state(pid) for pid in children] == ["gone", "gone"]


def test_without_the_extra_nothing_imports_mcp() -> None:
    code = "import sys, execbox_runner.cli, execbox_runner.mcp.cli; print(sorted(sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert "'mcp'" not in loaded.stdout and "'mcp_types'" not in loaded.stdout


def test_without_the_extra_the_command_says_how_to_install_it(tmp_path: Path) -> None:
    """execbox-runner is installed from a checkout, so the advice is a pip command for the checkout
    and this environment's Python, not a package index's name."""
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"x": {"command": "true"}}}))
    code = f"import sys; sys.modules['mcp'] = None; from execbox_runner.cli import main; sys.exit(main(['mcp', '--config', {str(config)!r}]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
    assert done.stderr.startswith("execbox-runner mcp: ")
    assert done.stderr.endswith(
        f"; install the mcp extra: in the checkout, {sys.executable} -m pip install -e '.[mcp]'\n"
    )


def test_a_bad_config_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"x": {"command": "a", "url": "http://b"}}}))
    done = subprocess.run(
        [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "give either `command` (stdio) or `url` (streamable HTTP)" in done.stderr
    config.write_text(json.dumps({"mcpServers": {}}))
    argv = [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(config), "--max-tool-calls", "0"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "argument --max-tool-calls: must be an integer > 0" in done.stderr
    server = {"command": sys.executable, "args": ["-c", "pass"]}
    config.write_text(json.dumps({"mcpServers": {"my-notes": server, "notes": server, "my_notes": server}}))
    done = subprocess.run(argv[:6], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr == (
        f"execbox-runner mcp: invalid server list {config}: servers 'my-notes' and 'my_notes' are both the guest"
        " namespace my_notes; rename one\n"
    )


def test_code_mode_refuses_two_namespaces_that_are_one_in_the_guest() -> None:
    with pytest.raises(ValueError, match="servers 'a-b' and 'a_b' are both the guest namespace a_b; rename one"):
        CodeMode(Runner.connect("ws://127.0.0.1:1/"), {"a-b": {"f": double}, "a_b": {"g": double}})


def test_a_bad_url_is_a_usage_error_and_a_failed_execution_names_its_reason(tmp_path: Path) -> None:
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {}}))
    argv = [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(config)]
    for extra, message in [
        (["--url", "http://x"], "not a ws:// or wss:// URL: 'http://x' (scheme isn't ws or wss)"),
        (
            ["--url", "ws://127.0.0.1:1/", "--token", "a b"],
            "the token must be printable ASCII without spaces, and not empty",
        ),
    ]:
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stderr) == (2, f"execbox-runner mcp: {message}\n")
    port = free_port()  # nothing listens there
    server = StdioServerParameters(command=argv[0], args=[*argv[1:], "--url", f"ws://127.0.0.1:{port}/"])

    async def main() -> mcp_types.CallToolResult:
        async with Client(server) as client:
            return await client.call_tool("execute_code", {"code": "1"})

    failed = run(main)
    assert failed.is_error
    reason = f"cannot connect to ws://127.0.0.1:{port}/: connection refused (nothing listens on 127.0.0.1:{port})"
    assert json.loads(failed.content[0].text) == {  # the shape of every answer, result and logs too
        "ok": False,
        "result": None,
        "error": {"code": "runner_unavailable", "message": reason},
        "logs": [],
    }


def test_any_failure_of_execute_code_is_its_result_with_the_reason() -> None:
    code_mode = CodeMode(Runner.local(), {})  # never started: every execution fails, though not as a RunnerError
    failed = run(lambda: code_mode.execute_code("1"))
    assert failed.is_error
    reason = "start the local runner first: `with Runner.local() as runner:` (or `async with`)"
    assert failed.structured_content == json.loads(failed.content[0].text)
    assert failed.structured_content == {
        "ok": False,
        "result": None,
        "error": {"code": "internal_error", "message": reason},
        "logs": [],
    }


def test_a_wrapped_server_that_does_not_start_says_why_within_the_startup_timeout(tmp_path: Path) -> None:
    config = tmp_path / "servers.json"
    argv = [sys.executable, "-m", "execbox_runner", "mcp", "--config", str(config), "--url", "ws://127.0.0.1:1/"]
    for server, reason in [
        ({"command": "false"}, "'false' exited, or closed its stdout, before the MCP handshake (see its stderr)"),
        ({"command": "sleep", "args": ["100"]}, "it did not complete the MCP handshake within 2 s (--startup-timeout)"),
    ]:
        config.write_text(json.dumps({"mcpServers": {"a": server}}))
        started = time.monotonic()
        done = subprocess.run([*argv, "--startup-timeout", "2"], capture_output=True, text=True, timeout=60)
        assert time.monotonic() - started < 9  # 2 s, the SDK's 2 s for a server to exit, and Python's start
        assert (done.returncode, done.stderr) == (1, f"execbox-runner mcp: MCP server 'a' did not start: {reason}\n")


WATCHED = '''
import json
from mcp.server.mcpserver import Context

@server.tool(structured_output=False)
def listing() -> str:
    """Files as JSON text, as most servers return them."""
    return json.dumps({"files": ["a.txt", "b.txt"]})

@server.tool(structured_output=False)
def greeting() -> str:
    """Text that is not JSON."""
    return "[hello]"

@server.tool()
async def steps(context: Context) -> str:
    """Reports its progress twice."""
    await context.report_progress(1, 2, "half way")
    await context.report_progress(2, 2)
    return "ok"

'''
WATCH_CODE = """
console.log("start");
const files = await up.listing();
const greeting = await up.greeting();
await up.steps();
console.log("files are", typeof files);
({files, greeting})
"""


@pytest.mark.parametrize("keep", [False, True], ids=["json text parsed", "--keep-json-text"])
def test_execute_code_streams_its_progress_and_parses_json_text(daemon: Daemon, tmp_path: Path, keep: bool) -> None:
    script = tmp_path / "watched.py"
    script.write_text(UPSTREAM.replace("if len(sys.argv) > 1:", WATCHED + "if len(sys.argv) > 1:"))
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"up": {"command": sys.executable, "args": [str(script)]}}}))
    argv = command(config, daemon, *(["--keep-json-text"] if keep else []))
    seen: list[tuple[float, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, message))

    async def main() -> mcp_types.CallToolResult:
        async with Client(StdioServerParameters(command=argv[0], args=argv[1:])) as client:
            return await client.call_tool("execute_code", {"code": WATCH_CODE}, progress_callback=progress)

    result = run(main)
    body = json.loads(result.content[0].text)
    assert body["ok"], body
    files = '{"files": ["a.txt", "b.txt"]}' if keep else {"files": ["a.txt", "b.txt"]}
    assert body["result"]["files"] == files and body["result"]["greeting"] == "[hello]"
    messages = [message for _, message in seen]
    assert messages[:6] == [
        "start",
        "calling up.listing",
        "calling up.greeting",
        "calling up.steps",
        "steps: half way",
        "steps: 2/2",
    ]
    assert messages[6:] == [f"files are {'string' if keep else 'object'}"]
    assert [done for done, _ in seen] == list(range(1, len(seen) + 1))  # progress only grows


CONTENT = '''
import mcp_types
from mcp.server.mcpserver.utilities.types import Image

@server.tool()
def chart() -> list:
    """A caption and a picture."""
    return ["sales by month", Image(data=b"not really a png", format="png")]

@server.tool()
def attachment() -> mcp_types.CallToolResult:
    """A file as an embedded resource."""
    body = mcp_types.TextResourceContents(uri="file:///notes.txt", mime_type="text/plain", text="buy milk")
    return mcp_types.CallToolResult(content=[mcp_types.EmbeddedResource(type="resource", resource=body)])

'''


def test_images_and_resources_reach_the_program_as_content_blocks(daemon: Daemon, tmp_path: Path) -> None:
    """A result with more than text reaches the guest whole, as its MCP content blocks, and the
    declarations say so; before, the guest got only the text ("" for a lone image or resource)."""
    script = tmp_path / "content.py"
    script.write_text(UPSTREAM.replace("if len(sys.argv) > 1:", CONTENT + "if len(sys.argv) > 1:"))
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"mcpServers": {"up": {"command": sys.executable, "args": [str(script)]}}}))
    argv = command(config, daemon)

    async def main() -> tuple[str, Any]:
        async with Client(StdioServerParameters(command=argv[0], args=argv[1:])) as client:
            found = await client.call_tool("search_tools", {"query": "picture"})
            code = "const [caption, picture] = await up.chart(); [caption.text, picture, await up.attachment()]"
            return found.content[0].text, (await client.call_tool("execute_code", {"code": code})).structured_content

    found, body = run(main)
    assert "function chart(" in found and "a result with images or resources is its MCP content blocks" in found
    assert body["ok"], body
    caption, picture, attachment = body["result"]
    assert caption == "sales by month"
    assert picture == {"type": "image", "data": base64.b64encode(b"not really a png").decode(), "mimeType": "image/png"}
    assert attachment == [
        {"type": "resource", "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain", "text": "buy milk"}}
    ]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{"a": [1, 2]}', {"a": [1, 2]}),
        (' [1, "two"] ', [1, "two"]),
        ("42", "42"),  # a number is as likely words as data: left as text
        ('"quoted"', '"quoted"'),
        ("{not json", "{not json"),
        ('{"a": NaN}', '{"a": NaN}'),  # Python's parser takes NaN; JSON has none
        ('{"a": 1} {"b": 2}', '{"a": 1} {"b": 2}'),  # two documents
    ],
)
def test_text_results_are_parsed_only_when_one_json_object_or_array(text: str, value: Any) -> None:
    result = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)])
    assert result_json("t", result) == value
    assert result_json("t", result, parse_json_text=False) == text


APPROVED = '''
removed = []

@server.tool(name="remove-file")
def remove_file(path: str) -> str:
    """Removes a file (needs the user's approval)."""
    removed.append(path)
    return f"removed {path}"

@server.tool()
def removed_files() -> list[str]:
    """What was removed."""
    return removed

'''
APPROVAL_CODE = """
const results = [];
for (const path of ["/tmp/a", "/etc/passwd", "/tmp/b"]) {
  try { results.push(await up.remove_file({path})); } catch (e) { results.push(e.message); }
}
({results, removed: await up.removed_files()})
"""


def test_a_tool_named_in_approve_asks_the_user_through_elicitation(daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "approved.py"
    script.write_text(UPSTREAM.replace("if len(sys.argv) > 1:", APPROVED + "if len(sys.argv) > 1:"))
    config = tmp_path / "servers.json"
    up = {"command": sys.executable, "args": [str(script)], "approve": ["remove-file"]}
    config.write_text(json.dumps({"mcpServers": {"up": up}}))
    argv = command(config, daemon)
    asked: list[str] = []

    async def user(context: Any, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        asked.append(params.message)
        if "/etc/" in params.message:
            return mcp_types.ElicitResult(action="decline")
        return mcp_types.ElicitResult(action="accept", content={"approve": "/tmp/a" in params.message})

    async def main(mode: str) -> Any:
        server = StdioServerParameters(command=argv[0], args=argv[1:])
        async with Client(server, elicitation_callback=user, mode=mode) as client:
            result = await client.call_tool("execute_code", {"code": APPROVAL_CODE})
            return json.loads(result.content[0].text)

    # A client of the initialize handshake is asked mid-call; one of the stateless protocol is asked
    # in rounds (input_required), the program waiting in the server between them. Both alike:
    for mode in ("legacy", "auto"):
        asked.clear()
        body = run(lambda: main(mode))  # noqa: B023 - run at once
        assert body["ok"], (mode, body)
        assert body["result"]["results"] == [
            {"result": "removed /tmp/a"},
            "Tool up.remove-file was not approved: the user declined",
            "Tool up.remove-file was not approved: the user refused",
        ], mode
        assert body["result"]["removed"] == {"result": ["/tmp/a"]}  # refused calls never reached the server
        assert len(asked) == 3 and 'up.remove-file({"path": "/tmp/a"})' in asked[0]  # removed_files needs none
