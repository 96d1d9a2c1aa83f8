/**
 * Returns a description of the first value in `root` that cannot cross the runner
 * boundary ("bigint at $.a[2]"), or `undefined` when all of it can: `null`, strings,
 * booleans, finite numbers, arrays without holes and plain objects (prototype
 * `Object.prototype` or `null`) of such values, without cycles. Shared sub-objects
 * are fine. `undefined` is accepted only as the whole value (as "no value").
 */
export function findUnsafeJson(root: unknown): string | undefined {
  if (root === undefined) {
    return undefined;
  }
  const onPath = new Set<object>();
  const checked = new WeakSet<object>();

  const visit = (value: unknown, path: string): string | undefined => {
    switch (typeof value) {
      case "string":
      case "boolean":
        return undefined;
      case "number":
        return Number.isFinite(value) ? undefined : `non-finite number at ${path}`;
      case "undefined":
        return `undefined at ${path}`;
      case "bigint":
      case "function":
      case "symbol":
        return `${typeof value} at ${path}`;
      default:
        break;
    }
    if (value === null) {
      return undefined;
    }
    const object = value as object;
    if (checked.has(object)) {
      return undefined;
    }
    if (onPath.has(object)) {
      return `cycle at ${path}`;
    }
    onPath.add(object);
    try {
      if (Array.isArray(object)) {
        for (let index = 0; index < object.length; index += 1) {
          if (!(index in object)) {
            return `array hole at ${path}[${index}]`;
          }
          const problem = visit(object[index], `${path}[${index}]`);
          if (problem !== undefined) {
            return problem;
          }
        }
      } else {
        const prototype: unknown = Object.getPrototypeOf(object);
        if (prototype !== Object.prototype && prototype !== null) {
          const name = object.constructor?.name;
          return `non-plain object${name ? ` (${name})` : ""} at ${path}`;
        }
        for (const key of Object.keys(object)) {
          const problem = visit(
            (object as Record<string, unknown>)[key],
            `${path}.${key}`,
          );
          if (problem !== undefined) {
            return problem;
          }
        }
      }
    } finally {
      onPath.delete(object);
    }
    checked.add(object);
    return undefined;
  };

  return visit(root, "$");
}
