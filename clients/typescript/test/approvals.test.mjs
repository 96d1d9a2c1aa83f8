// Approval of tool calls from guest code (defineProvider's `approve`), against a real daemon.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { defineProvider } from "../dist/index.js";
import { sharedExecutor } from "./helpers/executor.mjs";

const runner = sharedExecutor();

describe("approve", () => {
  test("an approved call runs; a refused one rejects in the guest and never runs", async () => {
    const removed = [];
    const fs = defineProvider({
      name: "fs",
      tools: {
        remove: {
          execute: ({ path }) => {
            removed.push(path);
            return `removed ${path}`;
          },
          approve: async ({ path }) => (path.startsWith("/tmp/") ? true : "only /tmp may be removed"),
        },
      },
    });
    const result = await runner.executor.execute(
      "const ok = await fs.remove({path: '/tmp/a'}); let refused; try { await fs.remove({path: '/etc'}) } catch (e) { refused = e.message } ({ok, refused})",
      [fs],
    );
    assert.equal(result.ok, true, JSON.stringify(result.error));
    assert.deepEqual(result.result, {
      ok: "removed /tmp/a",
      refused: "Tool fs.remove was not approved: only /tmp may be removed",
    });
    assert.deepEqual(removed, ["/tmp/a"]);
  });

  test("an execution that times out while the host asks ends as timeout; the question's signal aborts", { timeout: 20_000 }, async () => {
    let aborted = false;
    const fs = defineProvider({
      name: "fs",
      tools: {
        remove: {
          execute: () => assert.fail("ran without approval"),
          approve: (_input, context) =>
            new Promise((resolve) => {
              context.signal.addEventListener("abort", () => {
                aborted = true;
                resolve(false);
              });
            }),
        },
      },
    });
    // The question never ends by itself: the test's timeout fails a host that waits on it.
    const result = await runner.executor.execute("await fs.remove({path: '/tmp/x'})", [fs], { timeoutMs: 2_000 });
    assert.equal(result.error.code, "timeout");
    assert.equal(aborted, true);
  });
});
