// RunnerExecutor against a real execbox-runner daemon.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { connectWebSocketTransport, defineProvider, ExecuteFailure, RunnerExecutor } from "../dist/index.js";
import { startDaemon } from "./helpers/daemon.mjs";

let daemon;
let executor;

before(async () => {
  daemon = await startDaemon();
  executor = new RunnerExecutor({ url: daemon.url, timeoutMs: 5_000 });
});

after(async () => {
  await executor?.dispose();
  await daemon?.stop();
});

/** A provider whose `hang` tool waits until its signal aborts, recording what it saw. */
function hangingProvider() {
  const seen = { started: 0, aborted: 0 };
  let markStarted;
  const started = new Promise((resolve) => {
    markStarted = resolve;
  });
  const provider = defineProvider({
    name: "slow",
    tools: {
      hang: (_input, context) =>
        new Promise((_resolve, reject) => {
          seen.started += 1;
          markStarted();
          context.signal.addEventListener(
            "abort",
            () => {
              seen.aborted += 1;
              reject(new Error("aborted"));
            },
            { once: true },
          );
        }),
    },
  });
  return { provider, seen, started };
}

describe("results and logs", () => {
  test("an expression's value, console lines and durationMs", async () => {
    const result = await executor.execute(
      'console.log("a", 1, {b: 2}); console.error(undefined); 6 * 7',
      [],
    );
    assert.equal(result.ok, true);
    assert.equal(result.result, 42);
    assert.deepEqual(result.logs, ['a 1 {"b":2}', "undefined"]);
    assert.equal(typeof result.durationMs, "number");
  });

  test("undefined is a successful result with result undefined", async () => {
    const result = await executor.execute("const x = 1;", []);
    assert.deepEqual(result, { durationMs: result.durationMs, logs: [], ok: true, result: undefined });
    assert.ok("result" in result);
  });

  test("guest errors and per-call limits come back as results", async () => {
    const thrown = await executor.execute('throw new Error("nope")', []);
    assert.deepEqual(thrown.error, { code: "runtime_error", message: "nope" });
    const lines = await executor.execute(
      "for (let i = 0; i < 10; i++) console.log(i)",
      [],
      { maxLogLines: 3 },
    );
    assert.deepEqual(lines.logs, ["0", "1", "2"]);
    const unserializable = await executor.execute("(() => 1)", []);
    assert.equal(unserializable.error.code, "serialization_error");
  });

  test("the runner's own timeout ends a spinning guest well before the host backstop", async () => {
    const sent = [];
    const local = new RunnerExecutor({
      timeoutBackstopMs: 30_000,
      connectTransport: async () => {
        const transport = await connectWebSocketTransport(daemon.url);
        const send = transport.send.bind(transport);
        transport.send = (message) => {
          sent.push(message.type);
          return send(message);
        };
        return transport;
      },
    });
    const result = await local.execute("while (true) {}", [], { timeoutMs: 200 });
    assert.deepEqual(result.error, { code: "timeout", message: "Execution timed out" });
    assert.deepEqual(sent, ["execute"], "the runner's done came first: the host sent no cancel");
    await local.dispose();
  });

  test("a refused option is a validation_error result", async () => {
    const result = await executor.execute("1", [], { timeoutMs: 10_000_000_000 });
    assert.equal(result.ok, false);
    assert.equal(result.error.code, "validation_error");
    assert.match(result.error.message, /exceeds this runner's maximum/);
    const local = await executor.execute("1", [], { timeoutMs: Number.NaN });
    assert.deepEqual(local.error, {
      code: "validation_error",
      message: "timeoutMs must be a finite number, at least 0 (got NaN)",
    });
  });

  test("input only plain JavaScript can pass is a validation_error result, not a rejection", async () => {
    const provider = defineProvider({ name: "kv", tools: { get: () => 1 } });
    const refused = {
      "a provider not in an array": [provider, undefined],
      "no providers": [null, undefined],
      "a provider without tools": [[{ name: "kv", tools: null, types: "" }], undefined],
      "a signal that is no AbortSignal": [[provider], { signal: {} }],
    };
    for (const [what, [providers, options]] of Object.entries(refused)) {
      const result = await executor.execute("1", providers, options);
      assert.equal(result.error?.code, "validation_error", what);
    }
    const plain = await executor.execute("await kv.get()", [provider], null);
    assert.equal(plain.result, 1);
  });
});

describe("tools", () => {
  test("sync and async tools, their context, and several providers", async () => {
    const contexts = [];
    const math = defineProvider({
      name: "math",
      tools: {
        "add-numbers": {
          description: "Adds a and b",
          inputSchema: {
            type: "object",
            properties: { a: { type: "number" }, b: { type: "number" } },
            required: ["a", "b"],
          },
          execute: ({ a, b }, context) => {
            contexts.push(context);
            return a + b;
          },
        },
      },
    });
    const text = defineProvider({
      name: "text",
      tools: {
        upper: async (input) => {
          await sleep(5);
          return { value: String(input.s).toUpperCase() };
        },
      },
    });
    assert.match(math.types, /function add_numbers\(input: \{ a: number; b: number; \}\): Promise<unknown>;/);
    const result = await executor.execute(
      "const n = await math.add_numbers({a: 2, b: 3}); const u = await text.upper({s: 'hi'}); [n, u.value]",
      [math, text],
    );
    assert.deepEqual(result, { durationMs: result.durationMs, logs: [], ok: true, result: [5, "HI"] });
    assert.equal(contexts.length, 1);
    assert.equal(contexts[0].providerName, "math");
    assert.equal(contexts[0].safeToolName, "add_numbers");
    assert.equal(contexts[0].originalToolName, "add-numbers");
    assert.equal(contexts[0].signal.aborted, true, "the tool signal aborts when the execution ends");
  });

  test("a tool called without input gets undefined (the upstream hang)", async () => {
    const calls = [];
    const provider = defineProvider({
      name: "t",
      tools: {
        probe: (...args) => {
          calls.push(args);
          return { sawUndefined: args[0] === undefined };
        },
      },
    });
    const result = await executor.execute(
      "const a = await t.probe(); const b = await t.probe(undefined); [a, b]",
      [provider],
    );
    // A call left unanswered would end as a timeout, without this result.
    assert.deepEqual(result.result, [{ sawUndefined: true }, { sawUndefined: true }]);
    assert.equal(calls.length, 2);
    assert.equal(calls[0][0], undefined);
    assert.equal(calls[0].length, 2, "input and context");
  });

  test("a tool returning undefined resolves the guest's promise to undefined", async () => {
    const provider = defineProvider({ name: "t", tools: { nothing: () => undefined } });
    const result = await executor.execute(
      "const v = await t.nothing({}); v === undefined ? 'undefined' : typeof v",
      [provider],
    );
    assert.equal(result.result, "undefined");
  });

  test("a thrown Error is tool_error with its message; the guest can catch it", async () => {
    const provider = defineProvider({
      name: "t",
      tools: {
        fail: () => {
          throw new Error("disk on fire");
        },
        rejectString: async () => {
          throw "plain string";
        },
      },
    });
    const uncaught = await executor.execute("await t.fail({})", [provider]);
    assert.deepEqual(uncaught.error, { code: "tool_error", message: "disk on fire" });
    const caught = await executor.execute(
      "let r; try { await t.fail({}) } catch (e) { r = [e.code, e.message] } r",
      [provider],
    );
    assert.deepEqual(caught.result, ["tool_error", "disk on fire"]);
    const stringy = await executor.execute("await t.rejectString({})", [provider]);
    assert.deepEqual(stringy.error, { code: "tool_error", message: "plain string" });
  });

  test("ExecuteFailure (ours or execbox's, by name) keeps its code", async () => {
    class LookAlike extends Error {
      constructor(message) {
        super(message);
        this.name = "ExecuteFailure";
        this.code = "validation_error";
      }
    }
    const provider = defineProvider({
      name: "t",
      tools: {
        ours: () => {
          throw new ExecuteFailure("validation_error", "a is required");
        },
        theirs: () => {
          throw new LookAlike("b is required");
        },
        bogus: () => {
          const error = new Error("not trusted");
          error.code = "memory_limit";
          throw error;
        },
      },
    });
    const ours = await executor.execute("await t.ours({})", [provider]);
    assert.deepEqual(ours.error, { code: "validation_error", message: "a is required" });
    const theirs = await executor.execute("await t.theirs({})", [provider]);
    assert.deepEqual(theirs.error, { code: "validation_error", message: "b is required" });
    const bogus = await executor.execute("await t.bogus({})", [provider]);
    assert.deepEqual(bogus.error, { code: "tool_error", message: "not trusted" });
  });

  test("a non-JSON-safe tool result is a serialization_error for the guest", async () => {
    const provider = defineProvider({
      name: "t",
      tools: { date: () => ({ when: new Date(0) }), big: () => [1, 2n] },
    });
    const date = await executor.execute("await t.date({})", [provider]);
    assert.equal(date.error.code, "serialization_error");
    assert.match(date.error.message, /non-plain object \(Date\) at \$\.when/);
    const big = await executor.execute(
      "let r; try { await t.big({}) } catch (e) { r = e.code } r",
      [provider],
    );
    assert.equal(big.result, "serialization_error");
  });

  test("a hand-built provider (execbox's ResolvedToolProvider shape) works as is", async () => {
    const provider = {
      name: "raw",
      originalToSafeName: { "get.value": "get_value" },
      safeToOriginalName: { get_value: "get.value" },
      tools: {
        get_value: {
          originalName: "get.value",
          safeName: "get_value",
          description: "Returns a value",
          execute: async (input) => ({ input: input ?? null }),
        },
      },
      types: "declare namespace raw { function get_value(input?: unknown): Promise<unknown>; }",
    };
    const result = await executor.execute("(await raw.get_value({x: 1})).input.x", [provider]);
    assert.equal(result.result, 1);
  });
});

describe("cancellation", () => {
  test("aborting the signal while the guest awaits a tool: timeout, promptly, tool signal aborted", async () => {
    const { provider, seen, started } = hangingProvider();
    const controller = new AbortController();
    const pending = executor.execute(
      'console.log("before"); await slow.hang({})',
      [provider],
      { signal: controller.signal, timeoutMs: 30_000 },
    );
    await started;
    const abortedAt = Date.now();
    controller.abort();
    const result = await pending;
    const elapsed = Date.now() - abortedAt;
    assert.deepEqual(result.error, { code: "timeout", message: "Execution timed out" });
    assert.deepEqual(result.logs, ["before"], "the runner's done (with logs) came back");
    assert.ok(elapsed < 10_000, `took ${elapsed} ms after abort, as if left to the 30 s timeout`);
    assert.equal(seen.aborted, 1);
  });

  test("aborting the signal while the guest spins", async () => {
    const controller = new AbortController();
    const pending = executor.execute('console.log("spin"); while (true) {}', [], {
      signal: controller.signal,
      timeoutMs: 30_000,
    });
    await sleep(150);
    const abortedAt = Date.now();
    controller.abort();
    const result = await pending;
    assert.equal(result.error.code, "timeout");
    assert.ok(Date.now() - abortedAt < 10_000, "not left to the 30 s timeout");
  });

  test("an already aborted signal returns timeout without connecting", async () => {
    const controller = new AbortController();
    controller.abort();
    let connects = 0;
    const local = new RunnerExecutor({
      connectTransport: () => {
        connects += 1;
        return connectWebSocketTransport(daemon.url);
      },
    });
    const result = await local.execute("while (true) {}", [], { signal: controller.signal });
    assert.deepEqual(result, {
      durationMs: 0,
      error: { code: "timeout", message: "Execution timed out" },
      logs: [],
      ok: false,
    });
    assert.equal(connects, 0);
    await local.dispose();
  });

  test("the execution timeout aborts in-flight tool work", async () => {
    const { provider, seen } = hangingProvider();
    const result = await executor.execute("await slow.hang({})", [provider], { timeoutMs: 300 });
    await sleep(0);
    assert.equal(result.error.code, "timeout");
    assert.equal(seen.started, 1);
    assert.equal(seen.aborted, 1);
  });
});

describe("concurrency and lifecycle", () => {
  test("many concurrent executions, each with its own tool calls", async () => {
    let inFlight = 0;
    let maxInFlight = 0;
    const provider = defineProvider({
      name: "work",
      tools: {
        step: async ({ n }) => {
          inFlight += 1;
          maxInFlight = Math.max(maxInFlight, inFlight);
          await sleep(10);
          inFlight -= 1;
          return n * 2;
        },
      },
    });
    const count = 24;
    const results = await Promise.all(
      Array.from({ length: count }, (_, i) =>
        executor.execute(
          `let s = 0; for (let k = 0; k < 3; k++) s += await work.step({n: ${i} + k}); s`,
          [provider],
        ),
      ),
    );
    results.forEach((result, i) => {
      assert.equal(result.ok, true, JSON.stringify(result));
      assert.equal(result.result, 2 * (3 * i + 3));
    });
    assert.ok(maxInFlight > 1, "tool calls of different executions overlapped");
  });

  test("dispose cancels running executions, waits for them, then refuses new ones", async () => {
    const local = new RunnerExecutor({ url: daemon.url });
    const { provider, started } = hangingProvider();
    const running = local.execute("await slow.hang({})", [provider], { timeoutMs: 30_000 });
    await started;
    const disposedAt = Date.now();
    await local.dispose();
    assert.ok(Date.now() - disposedAt < 10_000, "not left to the 30 s timeout");
    const result = await running;
    assert.equal(result.error.code, "timeout");
    const later = await local.execute("1", []);
    assert.equal(later.error.code, "internal_error");
    assert.match(later.error.message, /disposed/);
  });

  test("an unreachable runner is an internal_error result, not a rejection", async () => {
    const nowhere = new RunnerExecutor({ url: "ws://127.0.0.1:9/", connectTimeoutMs: 2_000 });
    const result = await nowhere.execute("1", []);
    assert.equal(result.ok, false);
    assert.equal(result.error.code, "internal_error");
    assert.match(result.error.message, /Could not connect to the runner/);
    await nowhere.dispose();
  });

  test("the constructor needs a url or a connectTransport", () => {
    assert.throws(() => new RunnerExecutor({}), TypeError);
  });
});
