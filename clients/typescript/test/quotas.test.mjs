// A tenant at one of its quotas, against a real daemon: the refusal says which quota and why.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { connectWebSocketTransport, RunnerConnectionError, RunnerExecutor } from "../dist/index.js";
import { startDaemon } from "./helpers/daemon.mjs";

const TOKEN = "acme-token-0123456789";

describe("a tenant at its quota", () => {
  let daemon;
  let dir;
  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "execbox-quotas-"));
    const tokens = join(dir, "tokens");
    writeFileSync(tokens, `${TOKEN} tenant=acme max_sessions=1\n`);
    daemon = await startDaemon(["--tokens-file", tokens]);
  });
  after(async () => {
    await daemon?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  test("a second session is refused with 429, naming the quota and the runner's reason", async () => {
    const held = await connectWebSocketTransport({ url: daemon.url, token: TOKEN });
    try {
      const refusal = await connectWebSocketTransport({ url: daemon.url, token: TOKEN }).then(
        () => assert.fail("a second session was let in"),
        (error) => error,
      );
      assert.ok(refusal instanceof RunnerConnectionError);
      assert.equal(refusal.status, 429);
      assert.equal(refusal.quota, "max_sessions");
      assert.equal(typeof refusal.retryAfterSeconds, "number");
      assert.match(refusal.message, /HTTP 429 .*\(tenant acme has its maximum of 1 sessions? open\)/);

      const executor = new RunnerExecutor({ url: daemon.url, token: TOKEN });
      const result = await executor.execute("1 + 1", []);
      assert.equal(result.ok, false);
      assert.equal(result.error.code, "internal_error");
      assert.match(result.error.message, /tenant acme has its maximum/);
      await executor.dispose();
    } finally {
      await held.dispose();
    }
  });
});
