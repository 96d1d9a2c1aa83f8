// The declarations type a strict host: tsc --strict on test/types/*.ts (defineProvider's tools typed from
// their schemas; options), whose `@ts-expect-error` lines each need their error (an unmet one fails).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const packageDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(packageDir, "node_modules", ".bin", "tsc");

for (const exact of [false, true]) {
  test(`the declarations type-check a strict host (exactOptionalPropertyTypes: ${exact})`, { timeout: 120_000 }, async () => {
    const flags = ["--noEmit", "--strict", "--target", "ES2022", "--module", "NodeNext", "--moduleResolution", "NodeNext"];
    const files = ["define-provider.ts", "options.ts"].map((file) => join("test", "types", file));
    const checked = await run(tsc, [...flags, "--exactOptionalPropertyTypes", String(exact), "--types", "node", ...files], {
      cwd: packageDir,
      timeout: 110_000,
    }).catch((error) => error);
    assert.equal(checked.code ?? 0, 0, `${checked.stdout}${checked.stderr}`);
  });
}
