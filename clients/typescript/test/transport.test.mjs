// The WebSocket HostTransport against a real daemon: driven by hand, by
// runHostSession over one connection, and over the platform WebSocket.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import {
  connectWebSocketTransport,
  defineProvider,
  runHostSession,
  toProviderManifests,
} from "../dist/index.js";
import { startDaemon } from "./helpers/daemon.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const TOKEN = "transport-token";
let daemon;

before(async () => {
  daemon = await startDaemon(["--tokens", TOKEN]);
});
after(async () => {
  await daemon?.stop();
});

const options = { timeoutMs: 2_000, memoryLimitBytes: 64 << 20, maxLogLines: 100, maxLogChars: 64_000 };

test("driven by hand: started, an input-less tool_call with the input key, tool_result, done", async () => {
  const transport = await connectWebSocketTransport({ url: daemon.url, token: TOKEN });
  const messages = [];
  let finish;
  const finished = new Promise((resolve) => {
    finish = resolve;
  });
  transport.onMessage((message) => {
    messages.push(message);
    if (message.type === "tool_call") {
      void transport.send({ type: "tool_result", callId: message.callId, ok: true, result: { got: "it" } });
    } else if (message.type === "done") {
      finish(message);
    }
  });
  const provider = defineProvider({ name: "t", tools: { ping: () => null } });
  await transport.send({
    type: "execute",
    id: "exec-1",
    code: "const r = await t.ping(); r.got",
    options,
    providers: toProviderManifests([provider]),
  });
  const done = await finished;
  assert.deepEqual(messages[0], { type: "started", id: "exec-1" });
  assert.equal(messages[1].type, "tool_call");
  assert.equal(messages[1].providerName, "t");
  assert.equal(messages[1].safeToolName, "ping");
  assert.ok("input" in messages[1], "input key present for execbox's guard");
  assert.equal(messages[1].input, undefined);
  assert.equal(done.ok, true);
  assert.equal(done.result, "it");
  await transport.dispose();
  assert.equal(transport.closed, true);
});

test("runHostSession runs several executions one after another on one connection", async () => {
  const transport = await connectWebSocketTransport({ url: daemon.url, token: TOKEN });
  let closed = false;
  transport.onClose(() => {
    closed = true;
  });
  const provider = defineProvider({ name: "kv", tools: { get: ({ key }) => `value-of-${key}` } });
  for (const key of ["a", "b", "c"]) {
    const result = await runHostSession({
      transport,
      code: `await kv.get({key: "${key}"})`,
      providers: [provider],
      runtimeOptions: { timeoutMs: 2_000 },
      disposeTransport: false,
    });
    assert.equal(result.result, `value-of-${key}`);
  }
  assert.equal(closed, false);
  await transport.dispose();
  assert.equal(closed, true);
});

test("runHostSession answers providers that are not an array with validation_error and disposes the transport", async () => {
  const transport = await connectWebSocketTransport({ url: daemon.url, token: TOKEN });
  const provider = defineProvider({ name: "kv", tools: { get: () => 1 } });
  const result = await runHostSession({ transport, code: "1", providers: provider });
  assert.equal(result.error.code, "validation_error");
  assert.match(result.error.message, /providers must be an array/);
  await transport.dispose();
  assert.equal(transport.closed, true);
});

test("the platform WebSocket (globalThis.WebSocket) works too, token included", async (t) => {
  const args = [];
  if (typeof globalThis.WebSocket !== "function") {
    args.push("--experimental-websocket", "--no-warnings");
  }
  let stdout;
  try {
    ({ stdout } = await promisify(execFile)(
      process.execPath,
      [...args, join(here, "helpers/platform-client.mjs"), daemon.url, TOKEN],
      { timeout: 30_000 },
    ));
  } catch (error) {
    if (/bad option/.test(String(error.stderr))) {
      t.skip("this node has no platform WebSocket");
      return;
    }
    throw error;
  }
  const report = JSON.parse(stdout.trim().split("\n").at(-1));
  if (report.unavailable) {
    t.skip("this node has no platform WebSocket");
    return;
  }
  assert.equal(report.ok.ok, true, JSON.stringify(report.ok));
  assert.deepEqual(report.ok.result, [8, 42]);
  assert.equal(report.refused.ok, false);
  assert.equal(report.refused.error.code, "internal_error");
});
