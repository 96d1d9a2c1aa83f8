// The guest environment, evaluated in every fresh QuickJS context before guest code.
//
// It installs console and the provider namespaces, serializes values that cross
// the boundary, keeps the trust record of host errors, and tracks the outcome.
// Its value is one dispatcher function that only the worker holds: nothing the
// guest can reach leads back to it.
//
// Guest code runs after this and may tamper with every global and prototype, so
// every built-in used here is captured first and called in a form that later
// tampering cannot reach (uncurried methods, own-property reads, literals).
(() => {
  "use strict";
  const uncurry = Function.prototype.bind.call(Function.prototype.bind, Function.prototype.call);
  const G = globalThis;
  const ObjectPrototype = Object.prototype;
  const ArrayPrototype = Array.prototype;
  const getPrototypeOf = Object.getPrototypeOf;
  const defineProperty = Object.defineProperty;
  const objectKeys = Object.keys;
  const isArray = Array.isArray;
  const isFinite = Number.isFinite;
  const stringify = JSON.stringify;
  const parse = JSON.parse;
  const toStr = String;
  const isError = Error.isError;
  const ErrorCtor = Error;
  const TypeErrorCtor = TypeError;
  const PromiseCtor = Promise;
  const ProxyCtor = Proxy;
  const reflectConstruct = Reflect.construct;
  const reflectApply = Reflect.apply;
  const promiseThen = uncurry(Promise.prototype.then);
  const resolved = Promise.resolve();
  const toWellFormed = uncurry(String.prototype.toWellFormed);
  const slice = uncurry(String.prototype.slice);
  const MapCtor = Map;
  const mapGet = uncurry(Map.prototype.get);
  const mapSet = uncurry(Map.prototype.set);
  const mapDelete = uncurry(Map.prototype.delete);
  const mapForEach = uncurry(Map.prototype.forEach);
  const mapClear = uncurry(Map.prototype.clear);
  const weakMapGet = uncurry(WeakMap.prototype.get);
  const weakMapSet = uncurry(WeakMap.prototype.set);
  const weakSetAdd = uncurry(WeakSet.prototype.add);
  const weakSetHas = uncurry(WeakSet.prototype.has);
  const getOwnDescriptor = Object.getOwnPropertyDescriptor;
  const stackOf = uncurry(getOwnDescriptor(Error.prototype, "stack").get);
  const captureStackTrace = Error.captureStackTrace;

  // ---------------------------------------------------------------- engine hooks
  // Hooks through which guest code could run inside engine-raised errors, or
  // raise exceptions outside any promise, are closed before the guest starts.
  defineProperty(ErrorCtor, "prepareStackTrace", { value: undefined, writable: false, configurable: false });
  delete G.FinalizationRegistry; // its callbacks would throw outside any promise
  delete G.WeakRef;

  // ---------------------------------------------------------------- engine errors
  // Every error that JavaScript code constructs, the guest's or the bootstrap's,
  // is recorded in `made` as it is constructed: each error constructor is
  // replaced by a proxy, wherever guest code could reach it (the global, the
  // prototype's `constructor`, the parent of a derived constructor). An error
  // object missing from `made` was raised by the engine itself. The stack of a
  // recorded error starts where the guest constructed it, not in a trap below.
  const made = new WeakSet();
  const recorded = (error, trap) => {
    captureStackTrace(error, trap);
    weakSetAdd(made, error);
    return error;
  };
  const construct = (target, args, newTarget) => recorded(reflectConstruct(target, args, newTarget), construct);
  const apply = (target, self, args) => recorded(reflectApply(target, self, args), apply);
  const recorders = new MapCtor(); // constructor -> its recording proxy
  const ERROR_CONSTRUCTORS = ["Error", "EvalError", "RangeError", "ReferenceError", "SyntaxError", "TypeError", "URIError", "AggregateError", "SuppressedError", "DOMException"];
  // One handler for all the proxies (every trap works from its target): no guest code can reach
  // a proxy's handler, and eleven copies would cost every runtime ~4 KiB.
  const recorder = {
    __proto__: null,
    construct,
    apply,
    getPrototypeOf: (target) => {
      const parent = getPrototypeOf(target);
      const proxy = mapGet(recorders, parent);
      return proxy === undefined ? parent : proxy;
    },
  };
  const recording = (raw) => {
    const proxy = new ProxyCtor(raw, recorder);
    mapSet(recorders, raw, proxy);
    defineProperty(raw.prototype, "constructor", { value: proxy, writable: true, enumerable: false, configurable: true });
    return proxy;
  };
  for (const name of ERROR_CONSTRUCTORS) {
    const raw = G[name];
    if (typeof raw === "function") defineProperty(G, name, { value: recording(raw), writable: true, enumerable: false, configurable: true });
  }
  recording(InternalError); // reachable only as the constructor of an engine-raised InternalError
  delete G.InternalError;

  // ---------------------------------------------------------------- outcome state
  const TIMEOUT_MESSAGE = "Execution timed out";
  const trusted = new WeakMap(); // host-made errors -> [code, message]; never on the error itself
  const pending = new MapCtor(); // call id -> [resolve, reject]
  const outbox = new MapCtor(); // call id -> JSON text of [id, provider, tool, input]
  const logs = new MapCtor(); // line index -> JSON text of the line, since the last poll
  let nextCallId = 0;
  let logLines = 0;
  let logLinesSent = 0;
  let maxLogLines = 0;
  let logCharsLeft = 0;
  let aborting = false;
  // JSON text once settled: [1, value], [2] (undefined), [3, code, message] (final),
  // or [4, message, engine stack or null] (a guest failure, for the worker to judge).
  let outcome = null;

  // A path into a deep or wide value can be long: a host gets its start and its end.
  const MAX_DETAIL = 300;
  class SerializationFailure {
    constructor(detail) {
      this.detail = detail.length > MAX_DETAIL ? slice(detail, 0, 150) + "\u2026" + slice(detail, -140) : detail;
    }
  }

  const trustedError = (code, message) => {
    const error = new ErrorCtor(message);
    defineProperty(error, "code", { value: code, writable: true, enumerable: true, configurable: true });
    weakMapSet(trusted, error, [code, message]);
    return error;
  };

  const rejected = (reason) => new PromiseCtor((_, reject) => reject(reason));

  // ---------------------------------------------------------------- serialization
  // Transport-safe values only: null, strings, booleans, finite numbers, arrays
  // and plain objects (prototype Object.prototype or null). Nested undefined is
  // as JSON.stringify has it: an object property left out, null in an array (a
  // hole reads as undefined); undefined at the top is handled by the callers.
  // Shared sub-values are fine, cycles are not.
  const MAX_DEPTH = 256;
  const describe = (value) => {
    if (value === undefined) return "undefined";
    if (typeof value === "number") return toStr(value);
    if (typeof value !== "object") return typeof value;
    return "non-plain object";
  };

  const serialize = (value, path, ancestors, depth) => {
    switch (typeof value) {
      case "string":
        return stringify(toWellFormed(value));
      case "boolean":
        return value ? "true" : "false";
      case "number":
        if (!isFinite(value)) throw new SerializationFailure(`${describe(value)} at ${path}`);
        return stringify(value);
      case "object":
        if (value === null) return "null";
        break;
      default:
        throw new SerializationFailure(`${describe(value)} at ${path}`);
    }
    if (depth >= MAX_DEPTH) throw new SerializationFailure(`value nested deeper than ${MAX_DEPTH} levels at ${path}`);
    if (mapGet(ancestors, value) === true) throw new SerializationFailure(`cyclic value at ${path}`);
    const proto = getPrototypeOf(value);
    let text;
    mapSet(ancestors, value, true);
    if (isArray(value)) {
      if (proto !== ArrayPrototype) throw new SerializationFailure(`non-plain array at ${path}`);
      text = "[";
      const length = value.length;
      for (let i = 0; i < length; i++) {
        const item = value[i];
        text += (i ? "," : "") + (item === undefined ? "null" : serialize(item, `${path}[${i}]`, ancestors, depth + 1));
      }
      text += "]";
    } else {
      if (proto !== ObjectPrototype && proto !== null) throw new SerializationFailure(`${describe(value)} at ${path}`);
      text = "{";
      const keys = objectKeys(value);
      let first = true;
      for (let i = 0; i < keys.length; i++) {
        const key = keys[i];
        const item = value[key];
        if (item === undefined) continue;
        text += (first ? "" : ",") + stringify(toWellFormed(key)) + ":" + serialize(item, `${path}.${key}`, ancestors, depth + 1);
        first = false;
      }
      text += "}";
    }
    mapDelete(ancestors, value);
    return text;
  };

  const toJsonText = (value) => serialize(value, "$", new MapCtor(), 0);

  // ---------------------------------------------------------------- console
  // One line per call: arguments space-joined; strings raw, undefined as
  // "undefined", anything else JSON-stringified, else converted with String().
  const formatValue = (value) => {
    if (typeof value === "string") return value;
    if (value === undefined) return "undefined";
    try {
      const json = stringify(value);
      if (typeof json === "string") return json;
    } catch {}
    try {
      return toStr(value);
    } catch {
      return `[${typeof value}]`;
    }
  };

  // The spec's truncation, applied as lines arrive so a flood never fills memory:
  // keep the earliest maxLogLines lines, then spend maxLogChars (UTF-16 code
  // units, as JS .length counts) across them, clipping the line that runs out.
  const appendLog = (line) => {
    if (logLines >= maxLogLines || logCharsLeft <= 0) return;
    if (line.length > logCharsLeft) line = slice(line, 0, logCharsLeft);
    logCharsLeft -= line.length;
    mapSet(logs, logLines++, stringify(toWellFormed(line)));
  };

  const console = {};
  for (const name of ["log", "info", "warn", "error"]) {
    const method = (...args) => {
      let line = "";
      for (let i = 0; i < args.length; i++) line += (i ? " " : "") + formatValue(args[i]);
      appendLog(line);
    };
    defineProperty(console, name, { value: method, writable: true, enumerable: true, configurable: true });
  }
  defineProperty(G, "console", { value: console, writable: true, enumerable: false, configurable: true });

  // A microtask that throws would escape every promise; report it as the guest's failure instead.
  defineProperty(G, "queueMicrotask", {
    value: function queueMicrotask(callback) {
      if (typeof callback !== "function") throw recorded(new TypeErrorCtor("queueMicrotask requires a function"), queueMicrotask);
      promiseThen(resolved, () => {
        try {
          callback();
        } catch (error) {
          fail(error);
        }
      });
    },
    writable: true,
    enumerable: false,
    configurable: true,
  });

  // ---------------------------------------------------------------- tools
  const callTool = (provider, tool, input) => {
    if (aborting) return rejected(trustedError("timeout", TIMEOUT_MESSAGE));
    let inputText = "null";
    if (input !== undefined) {
      try {
        inputText = toJsonText(input);
      } catch (error) {
        if (error instanceof SerializationFailure) {
          return rejected(trustedError("serialization_error", `Guest code passed a non-serializable tool input: ${error.detail}`));
        }
        return rejected(error);
      }
    }
    const id = ++nextCallId;
    const promise = new PromiseCtor((resolve, reject) => mapSet(pending, id, [resolve, reject]));
    const hasInput = input !== undefined ? "true" : "false";
    mapSet(outbox, id, `[${id},${stringify(provider)},${stringify(tool)},${hasInput},${inputText}]`);
    return promise;
  };

  const install = (providersText, lines, chars) => {
    maxLogLines = lines;
    logCharsLeft = chars;
    const providers = parse(providersText);
    for (const [name, tools] of providers) {
      const namespace = {};
      for (const tool of tools) {
        const proxy = function (input) {
          return callTool(name, tool, input);
        };
        defineProperty(namespace, tool, { value: proxy, writable: true, enumerable: true, configurable: true });
      }
      defineProperty(G, name, { value: namespace, writable: true, enumerable: false, configurable: true });
    }
  };

  // ---------------------------------------------------------------- outcome
  const errorMessage = (error) => {
    try {
      if (error !== null && (typeof error === "object" || typeof error === "function")) {
        const message = error.message;
        if (typeof message === "string") return message;
      }
      return toStr(error);
    } catch {
      return "Guest code threw a value that cannot be described";
    }
  };

  const settleError = (code, message) => {
    if (outcome === null) outcome = `[3,${stringify(code)},${stringify(toWellFormed(message))}]`;
  };

  // JSON text of the stack of an error the engine raised ("" if it has none), else null.
  const engineStack = (error) => {
    if (!isError(error) || weakSetHas(made, error)) return "null";
    try {
      const stack = stackOf(error);
      if (typeof stack === "string") return stringify(toWellFormed(stack));
    } catch {}
    return '""';
  };

  // A trusted host error keeps its code; anything else thrown is judged by the
  // worker (memory_limit on evidence, the position of an engine error).
  const fail = (error) => {
    if (outcome !== null) return;
    const record = error !== null && typeof error === "object" ? weakMapGet(trusted, error) : undefined;
    if (record !== undefined) settleError(record[0], record[1]);
    else outcome = `[4,${stringify(toWellFormed(errorMessage(error)))},${engineStack(error)}]`;
  };

  const succeed = (value) => {
    if (outcome !== null) return;
    if (value === undefined) {
      outcome = "[2]";
      return;
    }
    try {
      outcome = `[1,${toJsonText(value)}]`;
    } catch (error) {
      if (error instanceof SerializationFailure) settleError("serialization_error", `Guest code returned a non-serializable value: ${error.detail}`);
      else fail(error);
    }
  };

  const start = (main) => {
    let promise;
    try {
      promise = main();
    } catch (error) {
      fail(error);
      return;
    }
    promiseThen(promise, succeed, fail);
  };

  // Everything the guest did since the last poll, as one flat JSON text:
  // [calls, logs, outcome-or-null]; calls are [id, provider, tool, hasInput, input].
  const poll = () => {
    let calls = "";
    mapForEach(outbox, (text) => {
      calls += (calls ? "," : "") + text;
    });
    mapClear(outbox);
    let lines = "";
    for (; logLinesSent < logLines; logLinesSent++) {
      lines += (lines ? "," : "") + mapGet(logs, logLinesSent);
      mapDelete(logs, logLinesSent);
    }
    // slice() flattens the rope strings that concatenation builds: the Python
    // binding cannot convert a rope.
    return slice(`[[${calls}],[${lines}],${outcome === null ? "null" : outcome}]`, 0);
  };

  // ``messageText``: the rejection's message as JSON text (it may hold lone surrogates).
  const settle = (id, ok, valueText, code, messageText) => {
    const callbacks = mapGet(pending, id);
    if (callbacks === undefined) return;
    mapDelete(pending, id);
    if (ok) callbacks[0](valueText === null || valueText === undefined ? undefined : parse(valueText));
    else callbacks[1](trustedError(code, parse(messageText)));
  };

  const abort = () => {
    aborting = true;
    mapForEach(pending, (callbacks) => callbacks[1](trustedError("timeout", TIMEOUT_MESSAGE)));
    mapClear(pending);
    mapClear(outbox);
  };

  return (op, a, b, c, d, e) => {
    switch (op) {
      case "install":
        return install(a, b, c);
      case "start":
        return start(a);
      case "poll":
        return poll();
      case "settle":
        return settle(a, b, c, d, e);
      case "abort":
        return abort();
    }
  };
})();
