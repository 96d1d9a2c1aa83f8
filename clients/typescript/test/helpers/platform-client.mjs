// Runs executions through the platform WebSocket (globalThis.WebSocket), for
// transport.test.mjs; prints one JSON line. Usage: node platform-client.mjs URL [TOKEN]
import { defineProvider, RunnerExecutor } from "../../dist/index.js";

const [url, token] = process.argv.slice(2);
if (typeof globalThis.WebSocket !== "function") {
  console.log(JSON.stringify({ unavailable: true }));
  process.exit(0);
}
const executor = new RunnerExecutor({ url, token, WebSocket: globalThis.WebSocket });
const provider = defineProvider({ name: "t", tools: { twice: (x) => (x ?? 21) * 2 } });
const ok = await executor.execute("[await t.twice(4), await t.twice()]", [provider]);
const refused = await new RunnerExecutor({ url, WebSocket: globalThis.WebSocket }).execute("1", []);
await executor.dispose();
console.log(JSON.stringify({ ok, refused }));
