// Tools whose schemas are Standard Schemas (zod here): rendered into types, and validated, against a real daemon.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { z } from "zod";

import { defineProvider } from "../dist/index.js";
import { sharedExecutor } from "./helpers/executor.mjs";

const runner = sharedExecutor();

const User = z.object({
  name: z.string().describe("The user's full name."),
  age: z.number().int().min(0),
  tags: z.array(z.string()).default([]),
});

function users(received, approvals = []) {
  return defineProvider({
    name: "users",
    tools: {
      create: {
        description: "Create a user.",
        inputSchema: z.object({ user: User, notify: z.boolean().optional() }),
        outputSchema: z.object({ id: z.number(), name: z.string() }),
        approve: (input) => {
          approvals.push(input);
          return true;
        },
        execute: (input) => {
          received.push(input);
          return { id: 7, name: input.user.name.toUpperCase() };
        },
      },
      broken: {
        outputSchema: z.object({ id: z.number() }),
        execute: () => ({ id: "seven" }),
      },
    },
  });
}

describe("Standard Schema tools", () => {
  test("the schemas are rendered into the provider's types", () => {
    const { types, tools } = users([]);
    assert.match(types, /function create\(input: \{ user: \{ name: string; age: number; tags\?: Array<string>; \}; notify\?: boolean; \}\): Promise<\{ id: number; name: string; \}>;/);
    assert.equal(tools.create.inputSchema.$schema, undefined);
    assert.equal(tools.create.inputSchema.properties.user.properties.name.description, "The user's full name.");
  });

  test("input the schema refuses rejects the guest's call and never runs the tool; good input runs it parsed", async () => {
    const received = [];
    const approvals = [];
    const code = `
      const made = await users.create({user: {name: "ada", age: 36}});
      const errors = [];
      for (const input of [{user: {name: "b", age: -1}}, {user: {name: "b", age: 1, tags: [1]}}, {}]) {
        try { await users.create(input); errors.push("no error"); } catch (e) { errors.push(e.code + ": " + e.message); }
      }
      const broken = await users.broken().catch((e) => e.code + ": " + e.message);
      ({made, errors, broken})`;
    const result = await runner.executor.execute(code, [users(received, approvals)]);
    assert.equal(result.ok, true, JSON.stringify(result.error));
    assert.deepEqual(result.result, {
      made: { id: 7, name: "ADA" },
      errors: [
        "validation_error: Invalid input for tool create: Too small: expected number to be >=0 - at $.user.age",
        "validation_error: Invalid input for tool create: Invalid input: expected string, received number - at $.user.tags[0]",
        "validation_error: Invalid input for tool create: Invalid input: expected object, received undefined - at $.user",
      ],
      broken: "validation_error: Invalid output for tool broken: Invalid input: expected number, received string - at $.id",
    });
    const parsed = { user: { name: "ada", age: 36, tags: [] } }; // the schema's default applied
    assert.deepEqual(received, [parsed]);
    assert.deepEqual(approvals, [parsed]); // approval is asked of checked input only
  });

  test("an object of schemas (an MCP-style shape) is one object's schema, unknown properties dropped", async () => {
    const received = [];
    const weather = defineProvider({
      name: "weather",
      tools: {
        forecast: {
          inputSchema: { city: z.string(), days: z.number().int().min(1).default(3), units: z.enum(["c", "f"]).optional() },
          execute: (input) => {
            received.push(input);
            return `${input.city}: ${input.days} days`;
          },
        },
      },
    });
    assert.match(weather.types, /function forecast\(input: \{ city: string; days\?: number; units\?: "c" \| "f"; \}\): Promise<unknown>;/);
    const code = `
      const ok = await weather.forecast({city: "Oslo", extra: 1});
      const errors = [];
      for (const input of [{days: 2}, {city: "Oslo", days: 0}, [1]]) {
        try { await weather.forecast(input); errors.push("no error"); } catch (e) { errors.push(e.code + ": " + e.message); }
      }
      ({ok, errors})`;
    const result = await runner.executor.execute(code, [weather]);
    assert.equal(result.ok, true, JSON.stringify(result.error));
    assert.deepEqual(result.result, {
      ok: "Oslo: 3 days",
      errors: [
        "validation_error: Invalid input for tool forecast: Invalid input: expected string, received undefined - at $.city",
        "validation_error: Invalid input for tool forecast: Too small: expected number to be >=1 - at $.days",
        "validation_error: Invalid input for tool forecast: Invalid input: expected object",
      ],
    });
    assert.deepEqual(received, [{ city: "Oslo", days: 3 }]);
  });

  test("a schema its library cannot express as JSON Schema is typed unknown and still validates", async () => {
    const clock = defineProvider({
      name: "clock",
      tools: {
        add: {
          inputSchema: z.object({ days: z.string().transform(Number) }),
          outputSchema: z.string().transform((text) => text.trim()), // no JSON Schema for what it gives
          execute: ({ days }) => ` ${new Date(Date.UTC(2026, 0, 1 + days)).toISOString().slice(0, 10)} `,
        },
      },
    });
    assert.match(clock.types, /function add\(input: \{ days: string; \}\): Promise<unknown>;/);
    const result = await runner.executor.execute(
      "[await clock.add({days: '2'}), await clock.add({days: 2}).catch((e) => e.code)]",
      [clock],
    );
    assert.equal(result.ok, true, JSON.stringify(result.error));
    assert.deepEqual(result.result, ["2026-01-03", "validation_error"]);
  });
});
