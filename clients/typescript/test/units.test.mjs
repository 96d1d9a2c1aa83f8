// Pure helpers: name sanitizing, provider building, JSON safety, message checks.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  checkRunnerMessage,
  defineProvider,
  findUnsafeJson,
  resolveRuntimeOptions,
  toProviderManifests,
  toSafeName,
} from "../dist/index.js";

test("toSafeName sanitizes as execbox does", () => {
  const cases = {
    "scrape-url": "scrape_url",
    "get.value": "get_value",
    "  spaced name ": "spaced_name",
    "__private__": "private",
    "9lives": "_9lives",
    delete: "delete_",
    "": "_",
    "---": "_",
    $dollar: "$dollar",
    "a--b": "a_b",
  };
  for (const [name, safe] of Object.entries(cases)) {
    assert.equal(toSafeName(name), safe, name);
  }
});

test("defineProvider: names, collisions, manifests and rendered types", () => {
  const provider = defineProvider({
    name: "web",
    tools: {
      "fetch-page": {
        description: "Fetches a page",
        inputSchema: {
          type: "object",
          properties: { url: { type: "string" }, "max-bytes": { type: "integer" } },
          required: ["url"],
        },
        outputSchema: { type: "object", properties: { status: { enum: [200, 404] } } },
        execute: () => ({}),
      },
      fetch_page: () => 1,
    },
  });
  assert.deepEqual(provider.originalToSafeName, { "fetch-page": "fetch_page", fetch_page: "fetch_page__2" });
  assert.deepEqual(provider.safeToOriginalName, { fetch_page: "fetch-page", fetch_page__2: "fetch_page" });
  assert.equal(
    provider.types,
    [
      "declare namespace web {",
      "  /** Fetches a page */",
      '  function fetch_page(input: { url: string; "max-bytes"?: number; }): Promise<{ status?: 200 | 404; }>;',
      "  function fetch_page__2(input?: unknown): Promise<unknown>;",
      "}",
    ].join("\n"),
  );
  assert.deepEqual(toProviderManifests([provider]), [
    {
      name: "web",
      tools: {
        fetch_page: { description: "Fetches a page", originalName: "fetch-page", safeName: "fetch_page" },
        fetch_page__2: { originalName: "fetch_page", safeName: "fetch_page__2" },
      },
      types: provider.types,
    },
  ]);
  assert.equal(defineProvider({ tools: {} }).name, "codemode");
  assert.throws(() => defineProvider({ name: "not-valid", tools: {} }), TypeError);
  assert.throws(() => defineProvider({ name: "class", tools: {} }), TypeError);
});

test("findUnsafeJson names the first unsafe value", () => {
  const shared = { x: 1 };
  const cyclic = { a: {} };
  cyclic.a.back = cyclic;
  const cases = [
    [undefined, undefined],
    [null, undefined],
    [{ a: [1, "s", true, null, { b: shared }], c: shared }, undefined],
    [Object.create(null), undefined],
    [{ a: 1n }, "bigint at $.a"],
    [[1, NaN], "non-finite number at $[1]"],
    [{ f() {} }, "function at $.f"],
    [{ a: undefined }, "undefined at $.a"],
    [[1, , 3], "array hole at $[1]"],
    [cyclic, "cycle at $.a.back"],
    [new Map(), "non-plain object (Map) at $"],
    [{ s: Symbol("x") }, "symbol at $.s"],
  ];
  for (const [value, expected] of cases) {
    assert.equal(findUnsafeJson(value), expected);
  }
});

test("checkRunnerMessage: normalizes, rejects malformed known messages, ignores unknown types", () => {
  assert.deepEqual(checkRunnerMessage({ type: "tool_call", callId: "c", providerName: "p", safeToolName: "t" }), {
    type: "tool_call",
    callId: "c",
    providerName: "p",
    safeToolName: "t",
    input: undefined,
  });
  const ok = checkRunnerMessage({ type: "done", id: "e", ok: true, durationMs: 1, logs: [] });
  assert.ok("result" in ok);
  assert.equal(checkRunnerMessage({ type: "progress", id: "e" }), undefined);
  assert.equal(typeof checkRunnerMessage({ type: "done", id: "e", ok: true, durationMs: 1 }), "string");
  assert.equal(
    typeof checkRunnerMessage({
      type: "done", id: "e", ok: false, durationMs: 1, logs: [], error: { code: "made_up", message: "m" },
    }),
    "string",
  );
  assert.equal(typeof checkRunnerMessage([]), "string");
});

test("resolveRuntimeOptions: per call, then executor, then execbox's defaults", () => {
  assert.deepEqual(resolveRuntimeOptions({ timeoutMs: 1_000, maxLogLines: 5 }, { timeoutMs: 50 }), {
    maxLogChars: 64_000,
    maxLogLines: 5,
    memoryLimitBytes: 64 * 1024 * 1024,
    timeoutMs: 50,
  });
});
