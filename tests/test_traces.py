"""OpenTelemetry traces across host and runner: the daemon's spans reach a real OTLP/HTTP receiver,
under the host's span whose ``traceparent`` came through the handshake; the Python client's own
spans join the same trace. Without OTEL_* asking for traces, nothing of OpenTelemetry is loaded."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from execbox_runner.daemon.observability import tracing

from .daemonkit import client, execute, receive, run_to_done, running_daemon


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP receiver on loopback: every span POSTed to ``/v1/traces``, decoded, and the
    ``service.name`` of each batch's resource."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.services: set[str] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def environment(self, **more: str) -> dict[str, str]:
        """A daemon's variables to send its spans here at once, and ``more``."""
        endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50", **more}

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        while len(self.spans) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.spans


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
        for resource in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
            self.server.services.add(attributes.get("service.name", ""))
            for scope in resource.scope_spans:
                self.server.spans.extend(scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        thread.join(10)


HOST = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from execbox_runner.client import Runner

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

def lookup(key: str) -> str:
    return key.upper()

code = "const a = await kv.lookup({key: 'a'}); const [b, c] = await Promise.all([kv.lookup({key: 'b'}), kv.lookup({key: 'c'})]); a + b + c"
with trace.get_tracer("the host").start_as_current_span("handle request"):
    result = Runner.connect(sys.argv[1]).execute_sync(code, {"kv": {"lookup": lookup}})
assert result.ok and result.result == "ABC", result
spans = [
    {"name": s.name, "trace": format(s.context.trace_id, "032x"), "id": format(s.context.span_id, "016x"),
     "parent": format(s.parent.span_id, "016x") if s.parent else None, "attributes": dict(s.attributes)}
    for s in exporter.get_finished_spans()
]
print(json.dumps(spans))
"""


def test_one_trace_shows_the_host_the_runner_and_the_tools(receiver: Receiver) -> None:
    with running_daemon(env=receiver.environment(OTEL_SERVICE_NAME="runner-under-test")) as daemon:
        host = subprocess.run(
            [sys.executable, "-c", HOST, daemon.url], capture_output=True, text=True, timeout=60, check=True
        )
        runner_spans = receiver.wait_for(4)
    client = {span["name"]: span for span in json.loads(host.stdout)}
    tools = [span for span in json.loads(host.stdout) if span["name"] == "execbox.tool"]
    request, execute = client["handle request"], client["execbox.execute"]
    assert execute["parent"] == request["id"] and execute["trace"] == request["trace"]
    assert len(tools) == 3 and all(tool["parent"] == execute["id"] for tool in tools)
    assert {tool["attributes"]["execbox.tool"] for tool in tools} == {"kv.lookup"}

    by_name: dict[str, list[Any]] = {}
    for span in runner_spans:
        by_name.setdefault(span.name, []).append(span)
    (execution,) = by_name["execbox.execution"]
    calls = by_name["execbox.tool_call"]
    assert execution.trace_id.hex() == request["trace"]  # one trace: the host's
    assert execution.parent_span_id.hex() == execute["id"]  # under the client's execute span
    assert len(calls) == 3 and all(call.parent_span_id == execution.span_id for call in calls)
    assert all(execution.start_time_unix_nano <= call.start_time_unix_nano for call in calls)
    assert all(call.end_time_unix_nano <= execution.end_time_unix_nano for call in calls)
    attributes = {a.key: a.value for a in execution.attributes}
    assert attributes["execbox.outcome"].string_value == "ok"
    assert attributes["execbox.execution_id"].string_value.startswith("exec-")
    assert attributes["execbox.tool_calls"].int_value == 3
    assert attributes["execbox.worker_pid"].int_value > 0
    assert {a.key: a.value for a in calls[0].attributes}["execbox.tool"].string_value == "kv.lookup"
    assert receiver.services == {"runner-under-test"}


def test_a_cancel_and_an_unanswered_tool_call_are_in_the_trace(receiver: Receiver) -> None:
    with running_daemon(env=receiver.environment()) as daemon:
        with client(daemon.url) as ws:
            ws.send(execute("c1", "await tools.hang({})"))
            assert receive(ws)["type"] == "started" and receive(ws)["type"] == "tool_call"
            ws.send(json.dumps({"type": "cancel", "id": "c1"}))
            assert receive(ws)["error"]["code"] == "timeout"
        spans = receiver.wait_for(2)
    (execution,) = [span for span in spans if span.name == "execbox.execution"]
    (call,) = [span for span in spans if span.name == "execbox.tool_call"]
    assert [event.name for event in execution.events] == ["execbox.cancel"]
    assert execution.status.code == 2 and execution.status.message == "timeout"  # STATUS_CODE_ERROR
    assert {a.key: a.value.bool_value for a in call.attributes}["execbox.answered"] is False
    assert call.end_time_unix_nano == execution.end_time_unix_nano
    assert receiver.services == {"execbox-runner"}  # the default name, where none is configured


def test_the_service_is_named_by_the_resource_attributes_too(receiver: Receiver) -> None:
    attributes = "service.name=runners-eu,deployment.environment=prod"
    with running_daemon(env=receiver.environment(OTEL_RESOURCE_ATTRIBUTES=attributes)) as daemon:
        with client(daemon.url) as ws:
            assert run_to_done(ws, "r1", "6 * 7")["result"] == 42
        receiver.wait_for(1)
    assert receiver.services == {"runners-eu"}


def test_the_hosts_trace_context_is_carried_on_with_its_tracestate(receiver: Receiver) -> None:
    host = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    headers = [("traceparent", host), ("tracestate", "vendor=abc"), ("tracestate", "other=1")]
    with running_daemon(env=receiver.environment()) as daemon:
        with client(daemon.url, additional_headers=headers) as ws:
            assert run_to_done(ws, "s1", "await tools.echo(1)")["ok"]
        spans = receiver.wait_for(2)
    (execution,) = [span for span in spans if span.name == "execbox.execution"]
    (call,) = [span for span in spans if span.name == "execbox.tool_call"]
    assert execution.trace_id.hex() == "0af7651916cd43dd8448eb211c80319c"
    assert execution.parent_span_id.hex() == "b7ad6b7169203331"
    assert execution.trace_state == call.trace_state == "vendor=abc,other=1"


def test_an_exporter_or_protocol_the_runner_does_not_make_is_warned_of(receiver: Receiver) -> None:
    environment = receiver.environment(OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_TRACES_EXPORTER="otlp,console")
    with running_daemon(env=environment) as daemon:
        with client(daemon.url) as ws:
            assert run_to_done(ws, "g1", "1")["ok"]
        assert [span.name for span in receiver.wait_for(1)] == ["execbox.execution"]  # over OTLP/HTTP
        lines = daemon.json_lines(lambda lines: len([line for line in lines if "setting" in line]) == 2)
    warnings = {line["setting"]: line["message"] for line in lines if "setting" in line}
    assert warnings == {
        "OTEL_TRACES_EXPORTER": "OTEL_TRACES_EXPORTER=otlp,console is not supported: the runner sends its "
        "traces over OTLP/HTTP (OTEL_TRACES_EXPORTER=otlp)",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "OTEL_EXPORTER_OTLP_PROTOCOL=grpc is not supported: the runner sends its "
        "traces over OTLP/HTTP (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)",
    }


def test_traces_asked_for_without_the_extra_say_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "execbox_runner.daemon.observability.spans", None)  # as if not installed
    with caplog.at_level(logging.WARNING, logger=tracing.log.name):
        assert tracing.from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) is None
    [warning] = [record.getMessage() for record in caplog.records]
    assert warning.startswith("OTEL_* asks for traces, but OpenTelemetry is not installed (")
    assert warning.endswith(f"): install the otel extra: in the checkout, {sys.executable} -m pip install -e '.[otel]'")


def test_traces_are_off_unless_the_environment_asks() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_SERVICE_NAME": "x"})
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert not tracing.wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none"})
    probe = (
        "import sys; from execbox_runner.daemon import server; from execbox_runner.daemon.observability import tracing;"
        "assert tracing.from_environment({}) is None;"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'opentelemetry was imported'"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)
