// Type-checked by types.test.mjs (tsc --strict): defineProvider types each tool's `execute` and
// `approve` from its Standard Schemas. Every `@ts-expect-error` must meet its error.
import { z } from "zod";

import { defineProvider, type SchemaType } from "../../dist/index.js";

const Order = z.object({ sku: z.string(), quantity: z.number().int().min(1) });

defineProvider({
  name: "shop",
  tools: {
    plain: ({ key }: { key: string }) => key,
    json: {
      inputSchema: { type: "object", properties: { key: { type: "string" } } },
      execute: ({ key }) => key, // a JSON Schema is not validated here: its input is `any`
    },
    shape: {
      inputSchema: { sku: z.string(), delay: z.number().optional() },
      execute: async ({ sku, delay }, { signal }) => sku.length + (delay ?? 0) + Number(signal.aborted),
    },
    place: {
      inputSchema: z.object({ order: Order, times: z.number().default(2) }),
      outputSchema: Order,
      execute: async ({ order, times }) => ({ ...order, quantity: order.quantity * times }),
      approve: ({ order }) => order.quantity < 10 || "too many",
    },
    annotated: {
      inputSchema: z.object({ sku: z.string() }),
      execute: ({ sku }: { sku: string }) => sku,
    },
    bare: { execute: () => 1 },
  },
});

defineProvider({
  tools: {
    bare: () => 1, // tools without schemas leave the others typed
    // @ts-expect-error sku is a string
    double: { inputSchema: z.object({ sku: z.string() }), execute: ({ sku }) => sku * 2 },
    // @ts-expect-error delay may be undefined
    wait: { inputSchema: { delay: z.number().optional() }, execute: ({ delay }) => delay.toFixed() },
    // @ts-expect-error the result must be what the output schema takes
    count: { outputSchema: z.object({ n: z.number() }), execute: () => ({ n: "one" }) },
    // @ts-expect-error approve gets the same input as execute
    remove: { inputSchema: z.object({ path: z.string() }), execute: () => 1, approve: ({ path }) => path > 1 },
    // @ts-expect-error an annotation that is not the schema's type
    wrong: { inputSchema: z.object({ path: z.string() }), execute: ({ path }: { path: number }) => path },
    // @ts-expect-error not a schema
    five: { inputSchema: 5, execute: () => 1 },
  },
});

const given: SchemaType<typeof Order, "output"> = { sku: "a", quantity: 1 };
void given;
