// Tool schemas: JSON Schemas, rendered into a provider's types; and Standard Schemas (zod, valibot,
// ArkType, ...), rendered through Standard JSON Schema and also validated, without depending on any
// of those libraries.
import { ExecuteFailure, type ToolExecutionContext } from "./types.js";

/**
 * A schema of any library that implements Standard Schema (https://standardschema.dev): zod 4,
 * valibot, ArkType, ... Its `jsonSchema` (Standard JSON Schema, zod 4.2 and later among them)
 * gives the JSON Schema rendered into `types`; its `types` (a type only) what it takes and gives.
 */
export interface StandardSchema<Input = unknown, Output = Input> {
  readonly "~standard": {
    readonly version: 1;
    readonly vendor: string;
    readonly validate: (value: unknown) => StandardResult | Promise<StandardResult>;
    readonly jsonSchema?: {
      readonly input: (options: { target: string }) => Record<string, unknown>;
      readonly output: (options: { target: string }) => Record<string, unknown>;
    };
    readonly types?: { readonly input: Input; readonly output: Output } | undefined;
  };
}

/** What a {@link StandardSchema} says of a value: the value it gives, or what is wrong where. */
export type StandardResult =
  | { readonly value: unknown; readonly issues?: undefined }
  | {
      readonly issues: ReadonlyArray<{
        readonly message: string;
        readonly path?: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }> | undefined;
      }>;
    };

/** A tool's schema: a JSON Schema, a {@link StandardSchema}, or an object of Standard Schemas (a shape). */
export type Schema = Record<string, unknown> | StandardSchema;

/**
 * The type of the values a schema takes (`"input"`) or gives (`"output"`): a Standard Schema's own,
 * a shape's object of its members' (those that may be `undefined` optional); `any` for a JSON
 * Schema or none, which are not validated here.
 */
export type SchemaType<S, Side extends "input" | "output"> = S extends {
  readonly "~standard": { readonly types?: infer Types };
}
  ? NonNullable<Types> extends { readonly input: infer Input; readonly output: infer Output }
    ? Side extends "input"
      ? Input
      : Output
    : unknown
  : S extends Record<string, StandardSchema>
    ? [keyof S] extends [never]
      ? any
      : Flat<Members<{ [K in keyof S]: SchemaType<S[K], Side> }>>
    : any;

type Members<T> = { [K in keyof T as undefined extends T[K] ? never : K]: T[K] } & {
  [K in keyof T as undefined extends T[K] ? K : never]?: T[K];
};

type Flat<T> = { [K in keyof T]: T[K] };

/**
 * A tool's schema as `jsonSchemaOf` and `validated` take it, made once per schema: a shape becomes
 * the Standard Schema of its object; a Standard Schema or a JSON Schema stays as it is.
 */
export function normalized(schema: Schema | undefined): Schema | undefined {
  if (schema === undefined || isStandard(schema)) {
    return schema;
  }
  const members = Object.entries(schema);
  if (members.length === 0 || !members.every(([, member]) => isStandard(member))) {
    return schema;
  }
  return objectOf(members as Array<[string, StandardSchema]>);
}

/**
 * A Standard Schema of an object with these members (unknown properties dropped, as zod's own
 * objects do). A member is required unless it accepts `undefined` (asked once, synchronously).
 */
function objectOf(members: Array<[string, StandardSchema]>): StandardSchema {
  const required = members
    .filter(([, member]) => {
      const result = member["~standard"].validate(undefined);
      return result instanceof Promise || result.issues !== undefined;
    })
    .map(([key]) => key);
  const render = (side: "input" | "output") => (options: { target: string }) => ({
    type: "object",
    properties: Object.fromEntries(
      members.map(([key, member]) => {
        const { $schema: _dialect, ...rest } = member["~standard"].jsonSchema?.[side](options) ?? {};
        return [key, rest];
      }),
    ),
    ...(required.length === 0 ? {} : { required }),
  });
  const described = members.every(([, member]) => member["~standard"].jsonSchema !== undefined);
  return {
    "~standard": {
      version: 1,
      vendor: "execbox-runner",
      validate: async (value) => {
        if (typeof value !== "object" || value === null || Array.isArray(value)) {
          return { issues: [{ message: "Invalid input: expected object" }] };
        }
        const parsed: Record<string, unknown> = {};
        for (const [key, member] of members) {
          const given = Object.prototype.hasOwnProperty.call(value, key) ? (value as Record<string, unknown>)[key] : undefined;
          const result = await member["~standard"].validate(given);
          if (result.issues !== undefined) {
            return { issues: result.issues.map((issue) => ({ ...issue, path: [key, ...(issue.path ?? [])] })) };
          }
          if (result.value !== undefined) {
            parsed[key] = result.value;
          }
        }
        return { value: parsed };
      },
      ...(described ? { jsonSchema: { input: render("input"), output: render("output") } } : {}),
    },
  };
}

function isStandard(schema: unknown): schema is StandardSchema {
  if (typeof schema !== "object" || schema === null) {
    return false;
  }
  const standard = (schema as Partial<StandardSchema>)["~standard"];
  return typeof standard === "object" && standard !== null && typeof standard.validate === "function";
}

/**
 * A schema's JSON Schema for `types` (`schema` as `normalized` gives it): none from a Standard
 * Schema without Standard JSON Schema, or one its library cannot express as JSON Schema (zod's
 * transforms and dates, say): its type is then `unknown`, and the schema still validates.
 */
export function jsonSchemaOf(
  schema: Schema | undefined,
  side: "input" | "output",
): Record<string, unknown> | undefined {
  if (schema === undefined || !isStandard(schema)) {
    return schema;
  }
  const render = schema["~standard"].jsonSchema?.[side];
  if (render === undefined) {
    return undefined;
  }
  try {
    const { $schema: _dialect, ...rest } = render({ target: "draft-2020-12" });
    return rest;
  } catch {
    return undefined;
  }
}

/** The value a Standard Schema gives for `value`, or a `validation_error` naming what is wrong where. */
async function checked(schema: StandardSchema, value: unknown, what: string): Promise<unknown> {
  const result = await schema["~standard"].validate(value);
  if (result.issues === undefined) {
    return result.value;
  }
  const [issue] = result.issues;
  const path = (issue?.path ?? [])
    .map((part) => (typeof part === "object" ? part.key : part))
    .map((key) => (typeof key === "number" ? `[${key}]` : `.${String(key)}`))
    .join("");
  const where = path === "" ? "" : ` - at $${path}`;
  throw new ExecuteFailure("validation_error", `${what}: ${issue?.message ?? "refused"}${where}`);
}

/**
 * `run` with its input and result checked by the Standard Schemas among them (see `ToolDefinition`);
 * `input` and `output` as `normalized` gives them.
 */
export function validated(
  name: string,
  run: (input: any, context: ToolExecutionContext) => unknown,
  input: Schema | undefined,
  output: Schema | undefined,
): (input: any, context: ToolExecutionContext) => unknown {
  const inputCheck = input !== undefined && isStandard(input) ? input : undefined;
  const outputCheck = output !== undefined && isStandard(output) ? output : undefined;
  if (inputCheck === undefined && outputCheck === undefined) {
    return run;
  }
  return async (value, context) => {
    const given = inputCheck === undefined ? value : await checked(inputCheck, value, `Invalid input for tool ${name}`);
    const result = await run(given, context);
    if (outputCheck === undefined) {
      return result;
    }
    return await checked(outputCheck, result, `Invalid output for tool ${name}`);
  };
}

