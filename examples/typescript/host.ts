// An execbox-style host: two tool providers, model-written code, and the sandboxed
// execution on an execbox-runner daemon instead of in-process QuickJS.
//
//   EXECBOX_RUNNER_URL=ws://127.0.0.1:8765/ [EXECBOX_RUNNER_TOKEN=...] node dist/host.js
//
// With @execbox/core the providers would come from `resolveProvider({...})`, which takes
// the same { name, tools: { originalName: { description, inputSchema, execute } } } and
// also validates inputs; and the executor line is the only one that changes:
//   const executor = new QuickJsExecutor();             // in-process
//   const executor = new RunnerExecutor({ url, token }); // remote, sandboxed daemon
import {
  defineProvider,
  ExecuteFailure,
  RunnerExecutor,
  type ResolvedToolProvider,
} from "@execbox-runner/client";

const url = process.env.EXECBOX_RUNNER_URL ?? "ws://127.0.0.1:8765/";
const token = process.env.EXECBOX_RUNNER_TOKEN;

// Host-side state and secrets stay here; the runner only sees names and types.
const forecasts: Record<string, { tempC: number; sky: string }> = {
  paris: { tempC: 18, sky: "cloudy" },
  lisbon: { tempC: 24, sky: "sunny" },
  oslo: { tempC: 7, sky: "rain" },
};
const notes: string[] = [];

const weather = defineProvider({
  name: "weather",
  tools: {
    "get-forecast": {
      description: "Tomorrow's forecast for a city",
      inputSchema: {
        type: "object",
        properties: { city: { type: "string" } },
        required: ["city"],
      },
      outputSchema: {
        type: "object",
        properties: { tempC: { type: "number" }, sky: { type: "string" } },
      },
      execute: async ({ city }: { city: string }) => {
        const forecast = forecasts[city.toLowerCase()];
        if (!forecast) {
          throw new ExecuteFailure("validation_error", `Unknown city: ${city}`);
        }
        return forecast;
      },
    },
    // Called with no input at all: the guest's `weather.list_cities()`.
    list_cities: () => Object.keys(forecasts),
  },
});

const notebook = defineProvider({
  name: "notebook",
  tools: {
    add_note: {
      description: "Saves a note and returns how many there are",
      inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
      execute: ({ text }: { text: string }) => {
        notes.push(text);
        return { count: notes.length };
      },
    },
  },
});

// What a model would be shown to write code against.
const providers: ResolvedToolProvider[] = [weather, notebook];
console.log(providers.map((provider) => provider.types).join("\n"));

// What a model might write.
const code = `
const cities = await weather.list_cities();
let warmest = null;
for (const city of cities) {
  const f = await weather.get_forecast({ city });
  console.log(city, f.tempC + "C", f.sky);
  if (!warmest || f.tempC > warmest.tempC) warmest = { city, ...f };
}
try {
  await weather.get_forecast({ city: "Atlantis" });
} catch (e) {
  console.warn("skipped:", e.code, e.message);
}
const { count } = await notebook.add_note({ text: "Pack for " + warmest.city });
({ warmest: warmest.city, notes: count })
`;

const executor = new RunnerExecutor({ url, token, timeoutMs: 5_000 });
const controller = new AbortController();
process.once("SIGINT", () => controller.abort()); // Ctrl-C cancels the execution
try {
  const result = await executor.execute(code, providers, { signal: controller.signal });
  for (const line of result.logs) {
    console.log(`[guest] ${line}`);
  }
  if (result.ok) {
    console.log("result:", JSON.stringify(result.result));
    console.log("host notes:", JSON.stringify(notes));
  } else {
    console.error(`error: ${result.error.code}: ${result.error.message}`);
    process.exitCode = 1;
  }
} finally {
  await executor.dispose();
}
