import path from "node:path";
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";
import { createVitestAliases } from "../scripts/workspace-entrypoints.ts";
const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
export default defineConfig({
  root: repoRoot,
  resolve: { alias: createVitestAliases(repoRoot) },
  test: { environment: "node", globals: true, include: ["execbox-runner-harness/**/*.test.ts"], testTimeout: 20_000 },
});
