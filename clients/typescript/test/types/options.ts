// Type-checked by types.test.mjs, also with exactOptionalPropertyTypes (which `tsc --init` turns
// on): an option may be given as a value that may be undefined, as the docs' snippets do.
import { connectWebSocketTransport, RunnerExecutor, type RuntimeLimits } from "../../dist/index.js";

const token: string | undefined = process.env.EXECBOX_RUNNER_TOKEN;
const signal: AbortSignal | undefined = undefined;
export const executor = new RunnerExecutor({ url: "ws://127.0.0.1:8765/", token, timeoutMs: undefined, tls: { ca: undefined } });
export const transport = connectWebSocketTransport({ url: "ws://127.0.0.1:8765/", token, signal });
export const run = () => executor.execute("1", [], { signal, onLog: undefined });
export const limits: RuntimeLimits = { timeoutMs: 1, memoryLimitBytes: 1, maxLogLines: 1, maxLogChars: 1 };
