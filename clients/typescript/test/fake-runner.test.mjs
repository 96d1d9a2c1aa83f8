// Host-side behaviour against scripted runners: the timeout backstop against a runner
// that never answers, cancel and its grace, protocol violations, refusals.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  connectWebSocketTransport,
  defineProvider,
  RunnerConnectionError,
  RunnerExecutor,
} from "../dist/index.js";
import { startFakeRunner, startLateRunner, startSilentTcpServer, waitFor } from "./helpers/fake-runner.mjs";

const send = (socket, message) => socket.send(JSON.stringify(message));

function done(id, extra = {}) {
  return { type: "done", id, ok: true, durationMs: 1, logs: [], ...extra };
}

describe("timeout backstop", () => {
  test("a runner that does not answer in time: cancel after timeoutMs + 100 ms, close after the 25 ms grace, timeout", async () => {
    const runner = await startLateRunner();
    try {
      const executor = new RunnerExecutor({ url: runner.url });
      const startedAt = Date.now();
      const result = await executor.execute("while (true) {}", [], { timeoutMs: 300 });
      const elapsed = Date.now() - startedAt;
      // Not the runner's "late" done: the host ended the execution itself.
      assert.deepEqual(result.error, { code: "timeout", message: "Execution timed out" });
      assert.deepEqual(result.logs, []);
      assert.ok(elapsed >= 420, `resolved after ${elapsed} ms, before the backstop and the grace`);

      const [connection] = runner.connections;
      await waitFor(() => connection.closedAt !== undefined);
      const [execute, cancel, ...rest] = connection.frames;
      assert.equal(execute.message.type, "execute");
      assert.deepEqual(execute.message.options, {
        maxLogChars: 64_000,
        maxLogLines: 100,
        memoryLimitBytes: 64 * 1024 * 1024,
        timeoutMs: 300,
      });
      assert.deepEqual(cancel.message, { type: "cancel", id: execute.message.id });
      assert.deepEqual(rest, [], "the close followed the cancel, nothing between");
      assert.ok(cancel.at - startedAt >= 390, `cancel ${cancel.at - startedAt} ms in, before the backstop`);
      await executor.dispose();
    } finally {
      await runner.stop();
    }
  });

  test("a runner that answers the cancel with done: that done is the result", async () => {
    const runner = await startFakeRunner({
      onMessage: (message, socket) => {
        if (message.type === "execute") {
          send(socket, { type: "started", id: message.id });
        } else if (message.type === "cancel") {
          send(socket, {
            type: "done",
            id: message.id,
            ok: false,
            durationMs: 250,
            logs: ["partial"],
            error: { code: "timeout", message: "Execution timed out" },
          });
        }
      },
    });
    try {
      const executor = new RunnerExecutor({ url: runner.url, timeoutMs: 150 });
      const result = await executor.execute("x", []);
      assert.deepEqual(result, {
        durationMs: 250,
        error: { code: "timeout", message: "Execution timed out" },
        logs: ["partial"],
        ok: false,
      });
      await executor.dispose();
      const [connection] = runner.connections;
      await waitFor(() => connection.closedAt !== undefined);
      assert.equal(connection.closeCode, 1000, "a normal close after done");
    } finally {
      await runner.stop();
    }
  });

  test("cancelGraceMs and timeoutBackstopMs can be set", async () => {
    const runner = await startFakeRunner();
    try {
      // Both longer than their defaults (25 and 100 ms), which these lower bounds would catch.
      const executor = new RunnerExecutor({
        url: runner.url,
        cancelGraceMs: 400,
        timeoutBackstopMs: 600,
      });
      const startedAt = Date.now();
      const result = await executor.execute("x", [], { timeoutMs: 100 });
      const elapsed = Date.now() - startedAt;
      assert.equal(result.error.code, "timeout");
      const [connection] = runner.connections;
      await waitFor(() => connection.closedAt !== undefined);
      const [, cancel] = connection.frames;
      assert.equal(cancel.message.type, "cancel");
      assert.ok(cancel.at - startedAt >= 690, `cancel ${cancel.at - startedAt} ms in, before the longer backstop`);
      assert.ok(elapsed >= 1_090, `resolved after ${elapsed} ms, before the longer grace`);
    } finally {
      await runner.stop();
    }
  });

  test("aborting the signal sends cancel at once, then closes after the grace", async () => {
    const runner = await startLateRunner();
    try {
      const executor = new RunnerExecutor({ url: runner.url });
      const controller = new AbortController();
      const pending = executor.execute("x", [], { signal: controller.signal, timeoutMs: 10_000 });
      await waitFor(() => runner.connections[0]?.frames.length === 1);
      const abortedAt = Date.now();
      controller.abort();
      const result = await pending;
      // Not the runner's "late" done (5 s in), nor the backstop's (10.1 s): the abort's.
      assert.equal(result.error.code, "timeout");
      assert.ok(Date.now() - abortedAt >= 20, "resolved after the grace");
      const [connection] = runner.connections;
      await waitFor(() => connection.closedAt !== undefined);
      assert.deepEqual(
        connection.frames.map((frame) => frame.message.type),
        ["execute", "cancel"],
      );
    } finally {
      await runner.stop();
    }
  });
});

describe("tool calls", () => {
  test("tool_call without input calls the tool with undefined; an undefined result omits result", async () => {
    const seen = [];
    const runner = await startFakeRunner({
      onMessage: (message, socket, connection) => {
        if (message.type === "execute") {
          send(socket, { type: "started", id: message.id });
          connection.id = message.id;
          send(socket, { type: "tool_call", callId: "call-1", providerName: "t", safeToolName: "probe" });
        } else if (message.type === "tool_result") {
          send(socket, done(connection.id, { result: "finished" }));
        }
      },
    });
    try {
      const provider = defineProvider({
        name: "t",
        tools: {
          probe: (...args) => {
            seen.push(args);
          },
        },
      });
      const executor = new RunnerExecutor({ url: runner.url });
      const result = await executor.execute("x", [provider], { timeoutMs: 5_000 });
      assert.equal(result.result, "finished", "answered: the runner's done follows the tool_result");
      assert.equal(seen.length, 1);
      assert.equal(seen[0][0], undefined);
      const reply = runner.connections[0].frames[1];
      assert.equal(reply.raw, '{"type":"tool_result","callId":"call-1","ok":true}');
      await executor.dispose();
    } finally {
      await runner.stop();
    }
  });

  test("the transport gives execbox's guard an input key on an input-less tool_call", async () => {
    const runner = await startFakeRunner({
      onMessage: (message, socket) => {
        if (message.type === "execute") {
          send(socket, { type: "tool_call", callId: "call-7", providerName: "p", safeToolName: "x" });
        }
      },
    });
    try {
      const transport = await connectWebSocketTransport(runner.url);
      const received = new Promise((resolve) => transport.onMessage(resolve));
      await transport.send({
        type: "execute",
        id: "e1",
        code: "",
        options: { timeoutMs: 1000, memoryLimitBytes: 1 << 26, maxLogLines: 10, maxLogChars: 100 },
        providers: [],
      });
      const message = await received;
      assert.equal(message.type, "tool_call");
      assert.ok("input" in message);
      assert.equal(message.input, undefined);
      await transport.dispose();
      assert.equal(transport.closed, true);
    } finally {
      await runner.stop();
    }
  });

  test("unknown tools, including inherited property names, answer internal_error", async () => {
    const runner = await startFakeRunner({
      onMessage: (message, socket, connection) => {
        if (message.type === "execute") {
          connection.id = message.id;
          for (const [i, name] of ["nope", "constructor", "__proto__", "toString"].entries()) {
            send(socket, { type: "tool_call", callId: `c${i}`, providerName: "t", safeToolName: name, input: {} });
          }
          send(socket, { type: "tool_call", callId: "c9", providerName: "other", safeToolName: "x", input: {} });
        } else if (connection.frames.length === 6) {
          send(socket, done(connection.id));
        }
      },
    });
    try {
      const provider = defineProvider({ name: "t", tools: { real: () => 1 } });
      const executor = new RunnerExecutor({ url: runner.url });
      const result = await executor.execute("x", [provider]);
      assert.equal(result.ok, true);
      const replies = runner.connections[0].frames.slice(1).map((frame) => frame.message);
      assert.equal(replies.length, 5);
      for (const reply of replies) {
        assert.equal(reply.ok, false);
        assert.equal(reply.error.code, "internal_error");
        assert.match(reply.error.message, /^Unknown tool /);
      }
      await executor.dispose();
    } finally {
      await runner.stop();
    }
  });
});

describe("protocol violations and lost runners", () => {
  test("a done for another id is ignored", async () => {
    const runner = await startFakeRunner({
      onMessage: (message, socket) => {
        if (message.type === "execute") {
          send(socket, done("someone-else", { result: "wrong" }));
          send(socket, done(message.id, { result: "right" }));
        }
      },
    });
    try {
      const executor = new RunnerExecutor({ url: runner.url });
      const result = await executor.execute("x", []);
      assert.equal(result.result, "right");
      await executor.dispose();
    } finally {
      await runner.stop();
    }
  });

  for (const [label, answer, pattern] of [
    ["a frame that is not JSON", (socket) => socket.send("{nope"), /not JSON/],
    ["a binary frame", (socket) => socket.send(Buffer.from("{}")), /binary/],
    [
      "a malformed done",
      (socket, id) => send(socket, { type: "done", id, ok: false, durationMs: 1, logs: [] }),
      /invalid message/,
    ],
    ["a close before done", (socket) => socket.close(1011, "worker lost"), /1011: worker lost/],
  ]) {
    test(`${label}: internal_error, promptly`, async () => {
      const runner = await startFakeRunner({
        onMessage: (message, socket) => {
          if (message.type === "execute") {
            answer(socket, message.id);
          }
        },
      });
      try {
        const executor = new RunnerExecutor({ url: runner.url });
        const result = await executor.execute("x", [], { timeoutMs: 5_000 });
        assert.equal(result.ok, false);
        // Left to the timeout backstop, the result would be a timeout.
        assert.equal(result.error.code, "internal_error");
        assert.match(result.error.message, pattern);
        await executor.dispose();
      } finally {
        await runner.stop();
      }
    });
  }

  test("a refused handshake (503 with Retry-After) is a RunnerConnectionError with its status", async () => {
    const runner = await startFakeRunner({
      verifyClient: (_info, callback) => callback(false, 503, "busy", { "Retry-After": "1" }),
    });
    try {
      await assert.rejects(connectWebSocketTransport({ url: runner.url }), (error) => {
        assert.ok(error instanceof RunnerConnectionError);
        assert.equal(error.status, 503);
        assert.equal(error.retryAfterSeconds, 1);
        assert.match(error.message, /503/);
        return true;
      });
      const executor = new RunnerExecutor({ url: runner.url });
      const result = await executor.execute("1", []);
      assert.equal(result.error.code, "internal_error");
      assert.match(result.error.message, /HTTP 503/);
    } finally {
      await runner.stop();
    }
  });

  test("a server that never completes the handshake: bounded by connectTimeoutMs", async () => {
    const silent = await startSilentTcpServer();
    try {
      const executor = new RunnerExecutor({ url: silent.url, connectTimeoutMs: 300 });
      const startedAt = Date.now();
      const result = await executor.execute("1", []);
      const elapsed = Date.now() - startedAt;
      assert.equal(result.error.code, "internal_error");
      // At least connectTimeoutMs; well under the 10 s default that would mean it was ignored.
      assert.ok(elapsed >= 250 && elapsed < 5_000, `took ${elapsed} ms`);
    } finally {
      await silent.stop();
    }
  });

  test("aborting while connecting returns timeout at once", async () => {
    const silent = await startSilentTcpServer();
    try {
      const executor = new RunnerExecutor({ url: silent.url, connectTimeoutMs: 30_000 });
      const controller = new AbortController();
      const pending = executor.execute("1", [], { signal: controller.signal });
      setTimeout(() => controller.abort(), 50);
      const startedAt = Date.now();
      const result = await pending;
      assert.equal(result.error.code, "timeout");
      // Not left to the 30 s connectTimeoutMs.
      assert.ok(Date.now() - startedAt < 10_000);
      await executor.dispose();
    } finally {
      await silent.stop();
    }
  });

  test("only ws:// and wss:// URLs", async () => {
    await assert.rejects(connectWebSocketTransport("http://127.0.0.1:1/"), RunnerConnectionError);
    const result = await new RunnerExecutor({ url: "not a url" }).execute("1", []);
    assert.equal(result.error.code, "internal_error");
  });
});

describe("retries", () => {
  test("a 429 is retried after its Retry-After when asked to, and surfaces as a result when not", async () => {
    let refusals = 1;
    const runner = await startFakeRunner({
      verifyClient: (_info, callback) => {
        if (refusals > 0) {
          refusals -= 1;
          callback(false, 429, "Too Many Requests", { "Retry-After": "1" });
          return;
        }
        callback(true);
      },
      onMessage: (message, socket) => {
        if (message.type === "execute") {
          send(socket, done(message.id, { result: 7 }));
        }
      },
    });
    try {
      const plain = new RunnerExecutor({ url: runner.url });
      const refused = await plain.execute("7", []);
      assert.equal(refused.ok, false);
      assert.match(refused.error.message, /429 Too Many Requests/);
      refusals = 1;
      const retrying = new RunnerExecutor({ url: runner.url, retries: 3 });
      const startedAt = Date.now();
      const result = await retrying.execute("7", []);
      assert.equal(result.result, 7);
      assert.ok(Date.now() - startedAt >= 900, "it waited for Retry-After");
      await plain.dispose();
      await retrying.dispose();
    } finally {
      await runner.stop();
    }
  });

  test("a Retry-After beyond the execution's timeoutMs is not waited for: the refusal is the result", { timeout: 20_000 }, async () => {
    let handshakes = 0;
    const runner = await startFakeRunner({
      verifyClient: (_info, callback) => {
        handshakes += 1;
        callback(false, 429, "Too Many Requests", { "Retry-After": "30" });
      },
    });
    try {
      const executor = new RunnerExecutor({ url: runner.url, retries: 3 });
      const result = await executor.execute("7", [], { timeoutMs: 1_000 });
      assert.equal(result.error.code, "internal_error");
      assert.match(result.error.message, /429 Too Many Requests/);
      assert.equal(handshakes, 1);
      await executor.dispose();
    } finally {
      await runner.stop();
    }
  });
});
