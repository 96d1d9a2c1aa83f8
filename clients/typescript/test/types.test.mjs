// The declarations type tools from their schemas: tsc --strict on test/types/*.ts, whose
// `@ts-expect-error` lines each need their error (an unmet one fails the check).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);
const packageDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(packageDir, "node_modules", ".bin", "tsc");

test("defineProvider types execute and approve from Standard Schemas", { timeout: 120_000 }, async () => {
  const flags = ["--noEmit", "--strict", "--target", "ES2022", "--module", "NodeNext", "--moduleResolution", "NodeNext"];
  const checked = await run(tsc, [...flags, "--types", "node", join("test", "types", "define-provider.ts")], {
    cwd: packageDir,
    timeout: 110_000,
  }).catch((error) => error);
  assert.equal(checked.code ?? 0, 0, `${checked.stdout}${checked.stderr}`);
});
