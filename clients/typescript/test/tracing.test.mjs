// Host-side spans with OpenTelemetry's API installed: an execution span whose traceparent reaches
// the runner in the handshake, and a child span per tool the host runs.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { propagation, trace } from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";

import { defineProvider, RunnerExecutor } from "../dist/index.js";
import { startDaemon } from "./helpers/daemon.mjs";
import { startAnsweringRunner } from "./helpers/fake-runner.mjs";

const exporter = new InMemorySpanExporter();
let daemon;

before(async () => {
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  daemon = await startDaemon();
});

after(async () => {
  await daemon?.stop();
  trace.disable();
  propagation.disable();
});

describe("tracing", () => {
  test("an execution span, a child span per tool, the outcome", async () => {
    exporter.reset();
    const kv = defineProvider({ name: "kv", tools: { lookup: ({ key }) => key.toUpperCase() } });
    const executor = new RunnerExecutor({ url: daemon.url });
    try {
      const result = await executor.execute(
        "const a = await kv.lookup({key: 'a'}); const b = await kv.lookup({key: 'b'}); a + b",
        [kv],
      );
      assert.equal(result.result, "AB");
      const failed = await executor.execute("throw new Error('no')", []);
      assert.equal(failed.error.code, "runtime_error");
    } finally {
      await executor.dispose();
    }
    const spans = exporter.getFinishedSpans();
    const executions = spans.filter((span) => span.name === "execbox.execute");
    const tools = spans.filter((span) => span.name === "execbox.tool");
    assert.equal(executions.length, 2);
    assert.equal(tools.length, 2);
    const [ok, error] = executions;
    for (const tool of tools) {
      assert.equal(tool.parentSpanContext?.spanId, ok.spanContext().spanId);
      assert.equal(tool.spanContext().traceId, ok.spanContext().traceId);
      assert.equal(tool.attributes["execbox.tool"], "kv.lookup");
    }
    assert.equal(ok.attributes["execbox.outcome"], "ok");
    assert.equal(error.attributes["execbox.error_code"], "runtime_error");
  });

  test("the runner gets the execution span's traceparent in the handshake", async () => {
    exporter.reset();
    const runner = await startAnsweringRunner();
    const executor = new RunnerExecutor({ url: runner.url });
    try {
      await executor.execute("1", []);
    } finally {
      await executor.dispose();
      await runner.stop();
    }
    const [execution] = exporter.getFinishedSpans();
    const { traceId, spanId } = execution.spanContext();
    assert.equal(runner.connections[0].headers.traceparent, `00-${traceId}-${spanId}-01`);
  });
});
