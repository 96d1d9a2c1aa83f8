// Live logs from the host's side: `onLog` sees each line as the guest writes it on
// execbox-runner, and every line once, at the end, on a runner without live logs.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { defineProvider, RunnerExecutor } from "../dist/index.js";
import { startDaemon } from "./helpers/daemon.mjs";
import { startAnsweringRunner } from "./helpers/fake-runner.mjs";

let daemon;

before(async () => {
  daemon = await startDaemon();
});

after(async () => {
  await daemon?.stop();
});

describe("onLog", () => {
  test("each line arrives while the guest runs, before the tool call that follows it", async () => {
    const seen = [];
    const ui = defineProvider({ name: "ui", tools: { shown: () => [...seen] } });
    const executor = new RunnerExecutor({ url: daemon.url });
    try {
      const result = await executor.execute(
        "console.log('one'); console.log('two'); const shown = await ui.shown(); console.log('three'); shown",
        [ui],
        { onLog: (line) => seen.push(line) },
      );
      assert.equal(result.ok, true);
      assert.deepEqual(result.result, ["one", "two"]);
      assert.deepEqual(seen, ["one", "two", "three"]);
      assert.deepEqual(result.logs, seen);
    } finally {
      await executor.dispose();
    }
  });

  // A line that came only with the done would leave the guest to spin out its 60 s: the test's
  // timeout fails that.
  test("the executor's onLog serves executions without their own, and a spinning guest's line comes before its timeout", { timeout: 20_000 }, async () => {
    const seen = [];
    const controller = new AbortController();
    const executor = new RunnerExecutor({
      url: daemon.url,
      onLog: (line) => {
        seen.push(line);
        controller.abort(); // cancelled as the line arrives, while the guest spins
      },
    });
    try {
      const result = await executor.execute("console.log('spinning'); while (true) {}", [], {
        signal: controller.signal,
        timeoutMs: 60_000,
      });
      assert.equal(result.error.code, "timeout");
      assert.deepEqual(result.logs, ["spinning"]);
      assert.deepEqual(seen, ["spinning"]);
    } finally {
      await executor.dispose();
    }
  });

  test("a runner without live logs: every line once, from the done; the header was asked", async () => {
    const runner = await startAnsweringRunner({ logs: ["a", "b"] });
    const seen = [];
    const executor = new RunnerExecutor({ url: runner.url });
    try {
      const result = await executor.execute("whatever", [], { onLog: (line) => seen.push(line) });
      assert.deepEqual(seen, ["a", "b"]);
      assert.deepEqual(result.logs, ["a", "b"]);
      assert.equal(runner.connections[0].headers["execbox-extensions"], "live-logs");
    } finally {
      await executor.dispose();
      await runner.stop();
    }
  });

  test("an onLog that throws ends the execution with internal_error, live or from the done", async () => {
    const executor = new RunnerExecutor({ url: daemon.url });
    const runner = await startAnsweringRunner({ logs: ["a"] });
    const fromDone = new RunnerExecutor({ url: runner.url });
    const onLog = () => {
      throw new Error("display gone");
    };
    try {
      const live = await executor.execute("console.log('a'); while (true) {}", [], { timeoutMs: 5_000, onLog });
      assert.deepEqual(live.error, { code: "internal_error", message: "onLog threw: display gone" });
      const atEnd = await fromDone.execute("1", [], { onLog });
      assert.deepEqual(atEnd.error, { code: "internal_error", message: "onLog threw: display gone" });
    } finally {
      await executor.dispose();
      await fromDone.dispose();
      await runner.stop();
    }
  });

  test("without onLog the handshake asks for nothing", async () => {
    const runner = await startAnsweringRunner();
    const executor = new RunnerExecutor({ url: runner.url });
    try {
      await executor.execute("1", []);
      assert.equal(runner.connections[0].headers["execbox-extensions"], undefined);
    } finally {
      await executor.dispose();
      await runner.stop();
    }
  });
});
