// `npm pack` yields a package that a fresh project installs, type-checks against and
// runs (against a real daemon).
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { startDaemon } from "./helpers/daemon.mjs";

const run = promisify(execFile);
const packageDir = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const npm = process.platform === "win32" ? "npm.cmd" : "npm";
const tsc = join(packageDir, "node_modules", ".bin", "tsc");

let daemon;
let work;

before(() => {
  work = mkdtempSync(join(tmpdir(), "execbox-client-pack-"));
});
after(async () => {
  await daemon?.stop();
  if (work) {
    rmSync(work, { recursive: true, force: true });
  }
});

test("npm pack, install into a fresh project, type-check and run", { timeout: 240_000 }, async () => {
  // 1. Pack (dist/ is built already; ci.sh builds before testing).
  const { stdout: packed } = await run(
    npm,
    ["pack", "--json", "--ignore-scripts", "--pack-destination", work],
    { cwd: packageDir, timeout: 60_000 },
  );
  const [info] = JSON.parse(packed);
  const files = info.files.map((file) => file.path).sort();
  assert.ok(files.includes("dist/index.js"));
  assert.ok(files.includes("dist/index.d.ts"));
  assert.ok(files.includes("README.md"));
  assert.ok(files.includes("package.json"));
  assert.deepEqual(
    files.filter((file) => !/^(dist\/|README\.md$|package\.json$|LICENSE$)/.test(file)),
    [],
    "nothing but dist/, README.md and package.json",
  );
  const tarball = join(work, info.filename);

  // 2. A fresh ESM project installs it from the tarball (ws comes from the registry or cache).
  const consumer = join(work, "consumer");
  await run("mkdir", ["-p", consumer]);
  writeFileSync(
    join(consumer, "package.json"),
    JSON.stringify({ name: "consumer", private: true, type: "module" }, null, 2),
  );
  await run(
    npm,
    ["install", tarball, "--no-audit", "--no-fund", "--prefer-offline", "--ignore-scripts"],
    { cwd: consumer, timeout: 180_000 },
  );
  assert.deepEqual(readdirSync(join(consumer, "node_modules", "@execbox-runner")), ["client"]);

  // 3. Its declarations type-check a TypeScript host (no @types/node needed), including
  //    assignability to execbox's Executor and HostTransport shapes.
  writeFileSync(
    join(consumer, "host.ts"),
    `import {
  connectWebSocketTransport,
  defineProvider,
  RunnerExecutor,
  type ExecuteResult,
  type ResolvedToolProvider,
} from "@execbox-runner/client";

// execbox's own shapes, restated as a host would see them from @execbox/core.
interface ExecboxExecutor {
  execute(
    code: string,
    providers: ResolvedToolProvider[],
    options?: { timeoutMs?: number; memoryLimitBytes?: number; maxLogLines?: number; maxLogChars?: number; signal?: AbortSignal },
  ): Promise<ExecuteResult>;
  dispose?(): Promise<void> | void;
}
interface ExecboxHostTransport {
  dispose(): Promise<void> | void;
  onClose(handler: (reason?: { code?: number | null; message: string }) => void): () => void;
  onError(handler: (error: Error) => void): () => void;
  onMessage(handler: (message: { type: "started" | "tool_call" | "done" }) => void): () => void;
  send(message: { type: "execute"; id: string; code: string; options: { timeoutMs: number; memoryLimitBytes: number; maxLogLines: number; maxLogChars: number }; providers: [] }): Promise<void> | void;
  terminate(): Promise<void> | void;
}

export async function main(url: string): Promise<ExecuteResult> {
  const executor: ExecboxExecutor = new RunnerExecutor({ url, token: "pack-token" });
  const transport: ExecboxHostTransport = await connectWebSocketTransport({ url, token: "pack-token" });
  await transport.dispose();
  const provider = defineProvider({ name: "calc", tools: { add: ({ a, b }: { a: number; b: number }) => a + b } });
  const result = await executor.execute("await calc.add({a: 1, b: 2})", [provider], { timeoutMs: 1000 });
  if (result.ok) {
    const value: unknown = result.result;
    void value;
  } else {
    const code: "timeout" | "memory_limit" | "validation_error" | "tool_error" | "runtime_error" | "serialization_error" | "internal_error" = result.error.code;
    void code;
  }
  return result;
}
`,
  );
  writeFileSync(
    join(consumer, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        module: "NodeNext",
        moduleResolution: "NodeNext",
        lib: ["ES2022", "DOM"],
        types: [],
        strict: true,
        noEmit: true,
      },
      files: ["host.ts"],
    }),
  );
  await run(tsc, ["-p", consumer], { cwd: consumer, timeout: 120_000 });

  // 4. And it runs: an execution with two providers through a daemon (started only now,
  //    after the install, which may take a while).
  daemon = await startDaemon(["--tokens", "pack-token"]);
  writeFileSync(
    join(consumer, "use.mjs"),
    `import { defineProvider, RunnerExecutor } from "@execbox-runner/client";
const executor = new RunnerExecutor({ url: process.argv[2], token: "pack-token" });
const calc = defineProvider({ name: "calc", tools: { add: ({ a, b }) => a + b } });
const text = defineProvider({ name: "text", tools: { shout: async ({ s }) => s.toUpperCase() + "!" } });
const result = await executor.execute(
  'const n = await calc.add({a: 20, b: 22}); await text.shout({s: "answer " + n})',
  [calc, text],
);
await executor.dispose();
console.log(JSON.stringify(result));
`,
  );
  const { stdout } = await run(process.execPath, ["use.mjs", daemon.url], {
    cwd: consumer,
    timeout: 30_000,
  });
  const result = JSON.parse(stdout.trim());
  assert.equal(result.ok, true, stdout);
  assert.equal(result.result, "ANSWER 42!");

  // 5. A CommonJS project's require() finds it: loaded where Node requires ES modules (20.19,
  //    22.12 and later), else Node's own ERR_REQUIRE_ESM, never "no exports main defined".
  const required = await run(
    process.execPath,
    ["-e", 'try { console.log(typeof require("@execbox-runner/client").RunnerExecutor) } catch (e) { console.log(e.code) }'],
    { cwd: consumer, timeout: 30_000 },
  );
  assert.match(required.stdout.trim(), /^(function|ERR_REQUIRE_ESM)$/);
});
