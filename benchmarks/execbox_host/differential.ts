// Differential runs through execbox's TypeScript host (RemoteExecutor over the ws transport): see differential.py.
// Usage: tsx differential.ts URL CORPUS.json. Each case runs alone, in order; one JSON line per case on stdout.
import { readFileSync } from "node:fs";
import { resolveProvider } from "@execbox/core";
import { RemoteExecutor } from "@execbox/remote";
import { connectWsTransport } from "./wsTransport";

// What a tool does when called: answer `returns` (or undefined if absent), echo its input, or throw;
// after `delayMs` if given. `throws` is a string (an Error with that message), or an object:
// { message, name?, code? } for an Error with those properties, or { value } to throw that value itself.
interface ToolAnswer {
  returns?: unknown;
  echo?: boolean;
  throws?: string | { message?: string; name?: string; code?: string; value?: unknown };
  delayMs?: number;
}
interface Case {
  name: string;
  code: string;
  providers?: Record<string, Record<string, ToolAnswer>>;
  options?: { timeoutMs?: number; memoryLimitBytes?: number; maxLogLines?: number; maxLogChars?: number };
}

const [url, corpusPath] = process.argv.slice(2);
const cases: Case[] = JSON.parse(readFileSync(corpusPath, "utf8"));
const executor = new RemoteExecutor({ connectTransport: () => connectWsTransport({ url, addMissingInput: true }) });

const thrown = (spec: NonNullable<ToolAnswer["throws"]>): unknown => {
  if (typeof spec === "string") return new Error(spec);
  if ("value" in spec) return spec.value;
  const error = new Error(spec.message ?? "");
  if (spec.name !== undefined) error.name = spec.name;
  if (spec.code !== undefined) Object.assign(error, { code: spec.code });
  return error;
};

const tool = (answer: ToolAnswer) => ({
  execute: async (input: unknown) => {
    if (answer.delayMs) await new Promise((resolve) => setTimeout(resolve, answer.delayMs));
    if (answer.throws !== undefined) throw thrown(answer.throws);
    return answer.echo ? input : answer.returns;
  },
});

// A result as JSON shows it, with what JSON cannot: undefined, and the type the host received.
const describe = (value: unknown) => ({ type: typeof value, json: value === undefined ? null : JSON.stringify(value) });

for (const c of cases) {
  const providers = Object.entries(c.providers ?? {}).map(([name, tools]) =>
    resolveProvider({ name, tools: Object.fromEntries(Object.entries(tools).map(([t, a]) => [t, tool(a)])) }),
  );
  let line: Record<string, unknown>;
  try {
    const r = await executor.execute(c.code, providers, c.options ?? {});
    line = r.ok
      ? { name: c.name, ok: true, result: describe(r.result), logs: r.logs }
      : { name: c.name, ok: false, error: r.error, logs: r.logs };
  } catch (error) {
    line = { name: c.name, host_threw: String(error) };
  }
  console.log(JSON.stringify(line));
}
process.exit(0);
