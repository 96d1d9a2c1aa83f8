import {
  ExecuteFailure,
  type ResolvedToolDescriptor,
  type ResolvedToolProvider,
  type ToolExecutionContext,
} from "./types.js";
import { jsonSchemaOf, normalized, type Schema, type SchemaType, validated } from "./schemas.js";

/**
 * One tool for {@link defineProvider}: a function, or a function with metadata. With a Standard
 * Schema (or a shape of them) as `inputSchema`, `execute` and `approve` get its output type, and
 * with one as `outputSchema`, `execute` must return its input type.
 */
export type ToolDefinition<In = Schema | undefined, Out = Schema | undefined> =
  | ((input: any, context: ToolExecutionContext) => unknown)
  | {
      description?: string | undefined;
      /**
       * The input's schema: a JSON Schema, rendered into the provider's `types` and not validated
       * here; or a Standard Schema (a zod schema, say) or an object of them (an MCP-style
       * shape: `{ city: z.string() }`), rendered and also validated: input it refuses rejects the
       * guest's call with `validation_error`, and `execute` gets the value it gives (its defaults
       * and transforms applied).
       */
      inputSchema?: (In & Schema) | undefined;
      /** The result's schema, as `inputSchema`: a Standard Schema also checks every result. */
      outputSchema?: (Out & Schema) | undefined;
      execute: (input: SchemaType<In, "output">, context: ToolExecutionContext) => Returned<Out>;
      /**
       * Each call runs only once this approves it: `true` approves; `false` or a reason (a
       * string) refuses, and the guest's call rejects with `tool_error` (the tool does not run).
       * The guest waits meanwhile, within the execution's timeout; `context.signal` aborts when
       * the execution ends, so a pending question can be dropped.
       */
      approve?:
        | ((input: SchemaType<In, "output">, context: ToolExecutionContext) => boolean | string | Promise<boolean | string>)
        | undefined;
    };

/** What `execute` returns: anything, or what a Standard `outputSchema` takes (or a promise of it). */
type Returned<Out> =
  unknown extends SchemaType<Out, "input">
    ? unknown
    : SchemaType<Out, "input"> | Promise<SchemaType<Out, "input">>;

/**
 * The input (or output) schemas of a provider's tools by tool name, which `defineProvider` infers
 * to type each tool; a tool without one has `unknown` there.
 */
type Schemas = Record<string, unknown>;

/** A provider for {@link defineProvider}. */
export interface ProviderDefinition<In extends Schemas = Schemas, Out extends Schemas = Schemas> {
  /** The guest namespace (a JavaScript identifier); defaults to `codemode`, as in execbox. */
  name?: string | undefined;
  /** Tools keyed by their original names. */
  tools: { [K in keyof In & keyof Out]: ToolDefinition<In[K], Out[K]> };
  /** TypeScript declarations for the model; rendered from the schemas when omitted. */
  types?: string | undefined;
}

const RESERVED = new Set(
  (
    "await break case catch class const continue debugger default delete do else enum " +
    "export extends false finally for function if import in instanceof new null return " +
    "super switch this throw true try typeof var void while with yield"
  ).split(" "),
);

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/**
 * The guest-visible name for a tool name, as execbox derives it: runs of characters
 * other than letters, digits, `_` and `$` become `_`, edge underscores go, a leading
 * digit gets a `_` prefix, a reserved word a `_` suffix, and nothing at all is `_`.
 */
export function toSafeName(name: string): string {
  let safe = name.trim().replace(/[^A-Za-z0-9_$]+/g, "_");
  safe = safe.replace(/^_+/, "").replace(/_+$/, "");
  if (safe === "") {
    safe = "_";
  }
  if (/^[0-9]/.test(safe)) {
    safe = `_${safe}`;
  }
  if (RESERVED.has(safe)) {
    safe = `${safe}_`;
  }
  return safe;
}

function propertyName(name: string): string {
  return IDENTIFIER.test(name) ? name : JSON.stringify(name);
}

/** A TypeScript type for a JSON Schema: the common keywords, `unknown` for the rest. */
function schemaType(schema: unknown, depth = 0): string {
  if (typeof schema !== "object" || schema === null || depth > 8) {
    return "unknown";
  }
  const s = schema as Record<string, unknown>;
  if (Array.isArray(s.enum)) {
    return s.enum.map((value) => JSON.stringify(value)).join(" | ") || "never";
  }
  if ("const" in s) {
    return JSON.stringify(s.const);
  }
  for (const key of ["anyOf", "oneOf"]) {
    const options = s[key];
    if (Array.isArray(options) && options.length > 0) {
      return options.map((option) => schemaType(option, depth + 1)).join(" | ");
    }
  }
  const type = s.type;
  if (Array.isArray(type)) {
    return type.map((one) => schemaType({ ...s, type: one }, depth + 1)).join(" | ");
  }
  switch (type) {
    case "string":
      return "string";
    case "number":
    case "integer":
      return "number";
    case "boolean":
      return "boolean";
    case "null":
      return "null";
    case "array":
      return `Array<${schemaType(s.items, depth + 1)}>`;
    case "object": {
      const properties = (s.properties ?? {}) as Record<string, unknown>;
      const required = new Set(Array.isArray(s.required) ? (s.required as string[]) : []);
      const members = Object.entries(properties).map(
        ([key, value]) =>
          `${propertyName(key)}${required.has(key) ? "" : "?"}: ${schemaType(value, depth + 1)};`,
      );
      if (members.length === 0) {
        return "Record<string, unknown>";
      }
      return `{ ${members.join(" ")} }`;
    }
    default:
      return "unknown";
  }
}

function renderTypes(name: string, tools: ResolvedToolDescriptor[]): string {
  const lines = [`declare namespace ${name} {`];
  for (const tool of tools) {
    if (tool.description) {
      lines.push(`  /** ${tool.description.replace(/\*\//g, "*\\/")} */`);
    }
    const input = tool.inputSchema ? `input: ${schemaType(tool.inputSchema)}` : "input?: unknown";
    const output = tool.outputSchema ? schemaType(tool.outputSchema) : "unknown";
    lines.push(`  function ${tool.safeName}(${input}): Promise<${output}>;`);
  }
  lines.push("}");
  return lines.join("\n");
}

/** `run`, behind `approve` when there is one (see `ToolDefinition`). */
function approved(
  name: string,
  run: (input: any, context: ToolExecutionContext) => unknown,
  approve: ((input: any, context: ToolExecutionContext) => boolean | string | Promise<boolean | string>) | undefined,
): (input: any, context: ToolExecutionContext) => unknown {
  if (approve === undefined) {
    return run;
  }
  return async (input, context) => {
    const verdict = await approve(input, context);
    if (verdict !== true) {
      const reason = typeof verdict === "string" && verdict !== "" ? `: ${verdict}` : "";
      throw new ExecuteFailure("tool_error", `Tool ${name} was not approved${reason}`);
    }
    return await run(input, context);
  };
}

/**
 * Builds a resolved provider (execbox's `ResolvedToolProvider` shape) from plain
 * functions, for hosts that do not use execbox's own `resolveProvider`. Tool names
 * are sanitized as execbox does (`originalName` is kept); `types` is rendered from
 * the schemas unless given. Inputs are validated against Standard Schemas (zod and
 * the like), not against JSON Schemas: with those, validate in the tool, and throw
 * `new ExecuteFailure("validation_error", ...)` to answer with that code.
 */
export function defineProvider<In extends Schemas, Out extends Schemas>(
  definition: ProviderDefinition<In, Out>,
): ResolvedToolProvider {
  const name = definition.name ?? "codemode";
  if (!IDENTIFIER.test(name) || RESERVED.has(name)) {
    throw new TypeError(`Invalid provider namespace: ${name}`);
  }
  const tools: Record<string, ResolvedToolDescriptor> = {};
  const originalToSafeName: Record<string, string> = {};
  const safeToOriginalName: Record<string, string> = {};
  for (const [originalName, tool] of Object.entries(definition.tools)) {
    const base = toSafeName(originalName);
    let safeName = base;
    for (let suffix = 2; Object.prototype.hasOwnProperty.call(tools, safeName); suffix += 1) {
      safeName = `${base}__${suffix}`;
    }
    const spec = typeof tool === "function" ? { execute: tool } : tool;
    const approve = "approve" in spec ? spec.approve : undefined;
    const checkedRun = approved(`${name}.${originalName}`, spec.execute, approve);
    const input = normalized(spec.inputSchema);
    const output = normalized(spec.outputSchema);
    const run = validated(originalName, checkedRun, input, output);
    const inputSchema = jsonSchemaOf(input, "input");
    const outputSchema = jsonSchemaOf(output, "output");
    tools[safeName] = {
      ...(spec.description === undefined ? {} : { description: spec.description }),
      ...(inputSchema === undefined ? {} : { inputSchema }),
      ...(outputSchema === undefined ? {} : { outputSchema }),
      originalName,
      safeName,
      execute: async (input, context) => await run(input, context),
    };
    originalToSafeName[originalName] = safeName;
    safeToOriginalName[safeName] = originalName;
  }
  return {
    name,
    originalToSafeName,
    safeToOriginalName,
    tools,
    types: definition.types ?? renderTypes(name, Object.values(tools)),
  };
}
