// examples/typescript runs against a real daemon: two providers, one execution.
// ci.sh builds the example first and sets EXECBOX_TEST_EXAMPLE_REQUIRED=1; without a build
// (a plain `npm test`) this test is skipped.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { startDaemon } from "./helpers/daemon.mjs";

const example = resolve(
  dirname(fileURLToPath(import.meta.url)),
  "../../../examples/typescript/dist/host.js",
);
const built = existsSync(example);
let daemon;

before(async () => {
  if (built) {
    daemon = await startDaemon(["--tokens", "example-token"]);
  }
});
after(async () => {
  await daemon?.stop();
});

test("examples/typescript: an execbox host with two providers", async (t) => {
  if (!built) {
    assert.notEqual(process.env.EXECBOX_TEST_EXAMPLE_REQUIRED, "1", `${example} is not built`);
    t.skip("examples/typescript is not built (ci.sh builds it)");
    return;
  }
  const { stdout } = await promisify(execFile)(process.execPath, [example], {
    env: { ...process.env, EXECBOX_RUNNER_URL: daemon.url, EXECBOX_RUNNER_TOKEN: "example-token" },
    timeout: 30_000,
  });
  assert.match(stdout, /declare namespace weather \{/);
  assert.match(stdout, /declare namespace notebook \{/);
  assert.match(stdout, /\[guest\] lisbon 24C sunny/);
  assert.match(stdout, /\[guest\] skipped: validation_error Unknown city: Atlantis/);
  assert.match(stdout, /result: \{"warmest":"lisbon","notes":1\}/);
  assert.match(stdout, /host notes: \["Pack for lisbon"\]/);
});
