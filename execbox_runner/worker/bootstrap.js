// The guest environment, evaluated in every fresh QuickJS context before guest code.
//
// It installs console and the provider namespaces, serializes values that cross
// the boundary, keeps the trust record of host errors, and tracks the outcome.
// Its value is one dispatcher function that only the worker holds: nothing the
// guest can reach leads back to it.
//
// Guest code runs after this and may tamper with every global and prototype, so
// every built-in used here is captured first and called in a form that later
// tampering cannot reach (uncurried methods, Reflect.apply, own-property reads,
// literals, objects without a prototype).
//
// Every runtime pays for what this builds, in time and memory: each function,
// closure, bound method, object and new name. So methods called a few times per
// execution go through Reflect.apply instead of being bound, and a helper used
// in one place is written out there.
(() => {
  "use strict";
  const reflectApply = Reflect.apply;
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
  const reflectConstruct = Reflect.construct;
  const promiseThen = Promise.prototype.then;
  const resolved = Promise.resolve();
  // Bound: called for every string or object that crosses the boundary.
  const toWellFormed = uncurry(String.prototype.toWellFormed);
  const slice = uncurry(String.prototype.slice);
  const charCodeAt = uncurry(String.prototype.charCodeAt); // per code unit of every line logged
  const MapCtor = Map;
  const mapGet = uncurry(Map.prototype.get);
  const mapSet = uncurry(Map.prototype.set);
  const mapDelete = uncurry(Map.prototype.delete);
  // Called through reflectApply: a few times per execution, or as errors are made.
  const weakMapGet = WeakMap.prototype.get;
  const weakMapSet = WeakMap.prototype.set;
  const weakSetAdd = WeakSet.prototype.add;
  const weakSetHas = WeakSet.prototype.has;
  const stackOf = Object.getOwnPropertyDescriptor(Error.prototype, "stack").get;
  const captureStackTrace = Error.captureStackTrace;
  // A non-enumerable property, as built-in globals are: `value` is set before each definition.
  const hidden = { __proto__: null, value: undefined, writable: true, enumerable: false, configurable: true };

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
    reflectApply(weakSetAdd, made, [error]);
    return error;
  };
  const construct = (target, args, newTarget) => recorded(reflectConstruct(target, args, newTarget), construct);
  const apply = (target, self, args) => recorded(reflectApply(target, self, args), apply);
  const recorders = new MapCtor(); // constructor -> its recording proxy
  // One handler for all the proxies (every trap works from its target): no guest code can reach
  // a proxy's handler.
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
  // The last is reachable only as the constructor of an engine-raised InternalError.
  for (const name of ["Error", "EvalError", "RangeError", "ReferenceError", "SyntaxError", "TypeError", "URIError", "AggregateError", "SuppressedError", "DOMException", "InternalError"]) {
    const raw = G[name];
    if (typeof raw !== "function") continue;
    hidden.value = new Proxy(raw, recorder);
    mapSet(recorders, raw, hidden.value);
    defineProperty(raw.prototype, "constructor", hidden);
    defineProperty(G, name, hidden);
  }
  delete G.InternalError;

  // ---------------------------------------------------------------- outcome state
  const TIMEOUT_MESSAGE = "Execution timed out";
  const trusted = new WeakMap(); // host-made errors -> [code, message]; never on the error itself
  const pending = { __proto__: null }; // call id -> [resolve, reject]
  let outbox = ""; // JSON texts of [id, provider, tool, hasInput, input], comma-separated, since the last poll
  let logs = ""; // JSON texts of the lines logged since the last poll, comma-separated (without a ring)
  // The worker's ring for log lines (see console below), if it gave one: from the start,
  // [its ArrayBuffer, its capacity in UTF-16 code units, Uint32Array, Uint16Array]; from the
  // first line on, [a view of its counters, a view of its data, its capacity]. One name for
  // all of it: each name a closure keeps costs every runtime a variable reference.
  let ring = null;
  let nextCallId = 0;
  let logLines = 0;
  let maxLogLines = 0;
  let logCharsLeft = 0;
  let aborting = false;
  // JSON text once settled: [1, value], [2] (undefined), [3, code, message] (final),
  // or [4, message, engine stack or null] (a guest failure, for the worker to judge).
  let outcome = null;

  // Made after guest code ran, which may have put `get` or `set` on Object.prototype: a descriptor
  // inheriting them would be an accessor descriptor, which defineProperty refuses with a value.
  // Its stack leaves out `above`, the outermost of the bootstrap's functions under way, and every
  // frame above it: the guest's own frames are all its stack shows (none, for a host's failure).
  // Its name, message and code are its own enumerable properties, in that order, as the reference
  // runner's are: JSON.stringify and spreading keep the message.
  const trustedError = (code, message, above) => {
    const error = new ErrorCtor();
    captureStackTrace(error, above);
    const own = { __proto__: null, value: "Error", writable: true, enumerable: true, configurable: true };
    defineProperty(error, "name", own);
    own.value = message;
    defineProperty(error, "message", own);
    own.value = code;
    defineProperty(error, "code", own);
    reflectApply(weakMapSet, trusted, [error, [code, message]]);
    return error;
  };

  // ---------------------------------------------------------------- serialization
  // Transport-safe values only: null, strings, booleans, finite numbers, arrays
  // and plain objects (prototype Object.prototype or null). Nested undefined is
  // as JSON.stringify has it: an object property left out, null in an array (a
  // hole reads as undefined); undefined at the top is handled by the callers.
  // Shared sub-values are fine, cycles are not.
  //
  // A value that cannot cross throws UNSERIALIZABLE, which no guest code can
  // reach or throw, with what and where in `unserializable`. A path into a deep
  // or wide value can be long: a host gets its start and its end.
  const MAX_DEPTH = 256;
  const MAX_DETAIL = 300;
  const UNSERIALIZABLE = { __proto__: null };
  let unserializable = "";
  const refuse = (what, path) => {
    const detail = `${what} at ${path}`;
    unserializable = detail.length > MAX_DETAIL ? slice(detail, 0, 150) + "\u2026" + slice(detail, -140) : detail;
    return UNSERIALIZABLE;
  };

  // What a thrown value says: its `message` if that is a string, else String(value).
  const describe = (error) => {
    try {
      const message = error !== null && (typeof error === "object" || typeof error === "function") ? error.message : undefined;
      return typeof message === "string" ? message : toStr(error);
    } catch {
      return "Guest code threw a value that cannot be described";
    }
  };

  // Why serializing a value threw `error`: what and where; or, as for the reference runner, what a
  // getter (or a proxy's trap) reading it threw. null for an error the engine raised meanwhile (out
  // of memory, say), which stays the guest's failure for the worker to judge.
  const whyUnserializable = (error) => {
    if (error === UNSERIALIZABLE) return unserializable;
    if (isError(error) && !reflectApply(weakSetHas, made, [error])) return null;
    return `reading it threw: ${describe(error)}`;
  };

  const serialize = (value, path, ancestors, depth) => {
    switch (typeof value) {
      case "string":
        return stringify(toWellFormed(value));
      case "boolean":
        return value ? "true" : "false";
      case "number":
        if (!isFinite(value)) throw refuse(toStr(value), path);
        return stringify(value);
      case "object":
        if (value === null) return "null";
        break;
      default:
        throw refuse(typeof value, path);
    }
    if (depth >= MAX_DEPTH) throw refuse(`value nested deeper than ${MAX_DEPTH} levels`, path);
    if (mapGet(ancestors, value) === true) throw refuse("cyclic value", path);
    const proto = getPrototypeOf(value);
    let text;
    mapSet(ancestors, value, true);
    if (isArray(value)) {
      if (proto !== ArrayPrototype) throw refuse("non-plain array", path);
      text = "[";
      const length = value.length;
      for (let i = 0; i < length; i++) {
        const item = value[i];
        text += (i ? "," : "") + (item === undefined ? "null" : serialize(item, `${path}[${i}]`, ancestors, depth + 1));
      }
      text += "]";
    } else {
      if (proto !== ObjectPrototype && proto !== null) throw refuse("non-plain object", path);
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

  // ---------------------------------------------------------------- console
  // One line per call: arguments space-joined; strings raw, undefined as
  // "undefined", anything else JSON-stringified, else converted with String().
  // As execbox's reference runner has it: a value whose JSON is a string (a Date)
  // is that string, unquoted; an error's JSON gains its name, message and stack
  // (where it has them and its enumerable properties do not), which JSON leaves out.
  // The spec's truncation applies as lines arrive, so a flood never fills memory:
  // keep the earliest maxLogLines lines, then spend maxLogChars (UTF-16 code
  // units, as JS .length counts) across them, clipping the line that runs out.
  // One function serves all four methods.
  //
  // Each kept line goes into the worker's ring as it is written (worker/logring.py): a
  // header of two 32-bit counters of code units, written (ours, stored once the units are
  // in) and read (the worker's), then the units; a line is its length in two units, then
  // its units. The worker reads the ring while the guest runs, so a guest stopped at its
  // deadline, or cancelled while it spins, keeps every line. With the ring full, the
  // guest waits here until the worker has read some (or its deadline stops it). Nothing
  // here reads a property of the ring or its views: guest code can reach prototypes.
  // The counters are plain elements, not Atomics (whose namespace, once touched, costs
  // every runtime its methods' names): the engine runs one store at a time, in order,
  // and the worker relies on x86-64's store order (logring.py).
  const errorText = (error, copy) => {
    for (const key of ["name", "message", "stack"]) {
      if (copy[key] !== undefined) continue;
      const value = error[key];
      if (value !== undefined) defineProperty(copy, key, { __proto__: null, value, writable: true, enumerable: true, configurable: true });
    }
    return stringify(copy);
  };
  const log = (...args) => {
    let line = "";
    for (let i = 0; i < args.length; i++) {
      const value = args[i];
      let text;
      if (typeof value === "string") text = value;
      else if (value === undefined) text = "undefined";
      else {
        try {
          text = stringify(value);
          if (typeof text === "string" && charCodeAt(text, 0) === 34) text = parse(text);
          else if (isError(value) && charCodeAt(text, 0) === 123) text = errorText(value, parse(text));
        } catch {}
        if (typeof text !== "string") {
          try {
            text = toStr(value);
          } catch {
            text = `[${typeof value}]`;
          }
        }
      }
      line += (i ? " " : "") + text;
    }
    if (logLines >= maxLogLines || logCharsLeft <= 0) return;
    if (line.length > logCharsLeft) line = slice(line, 0, logCharsLeft);
    logCharsLeft -= line.length;
    logLines++;
    line = toWellFormed(line);
    if (ring === null) {
      logs += (logs ? "," : "") + stringify(line);
      return;
    }
    if (ring.length === 4) ring = [new ring[2](ring[0], 0, 2), new ring[3](ring[0], 16, ring[1]), ring[1]];
    const head = ring[0];
    const data = ring[1];
    const units = ring[2];
    const length = line.length;
    let written = head[0];
    for (let i = -2; i < length; ) {
      let room = units - ((written - head[1]) >>> 0);
      for (; room > 0 && i < length; room--, i++, written = (written + 1) >>> 0) {
        data[written & (units - 1)] = i >= 0 ? charCodeAt(line, i) : i === -2 ? length & 0xffff : length >>> 16;
      }
      head[0] = written;
    }
  };
  hidden.value = { log, info: log, warn: log, error: log };
  defineProperty(G, "console", hidden);

  // A microtask that throws would escape every promise; report it as the guest's failure instead.
  hidden.value = function queueMicrotask(callback) {
    if (typeof callback !== "function") throw recorded(new TypeErrorCtor("queueMicrotask requires a function"), queueMicrotask);
    reflectApply(promiseThen, resolved, [
      () => {
        try {
          callback();
        } catch (error) {
          fail(error);
        }
      },
    ]);
  };
  defineProperty(G, "queueMicrotask", hidden);

  // ---------------------------------------------------------------- tools
  const callTool = (provider, tool, input, proxy) => {
    let failed = aborting;
    let reason = failed ? trustedError("timeout", TIMEOUT_MESSAGE, proxy) : undefined;
    let inputText = "null";
    if (!failed && input !== undefined) {
      try {
        inputText = serialize(input, "$", new MapCtor(), 0);
      } catch (error) {
        failed = true;
        const why = whyUnserializable(error);
        reason = why === null ? error : trustedError("serialization_error", `Guest code passed a non-serializable tool input: ${why}`, proxy);
      }
    }
    if (failed) return new PromiseCtor((_, reject) => reject(reason));
    const id = ++nextCallId;
    const promise = new PromiseCtor((resolve, reject) => {
      pending[id] = [resolve, reject];
    });
    const hasInput = input !== undefined ? "true" : "false";
    outbox += (outbox ? "," : "") + `[${id},${stringify(provider)},${stringify(tool)},${hasInput},${inputText}]`;
    return promise;
  };

  // ---------------------------------------------------------------- outcome
  // A trusted host error keeps its code; anything else thrown is judged by the
  // worker (memory_limit on evidence, the position of an engine error).
  const fail = (error) => {
    if (outcome !== null) return;
    const record = error !== null && typeof error === "object" ? reflectApply(weakMapGet, trusted, [error]) : undefined;
    if (record !== undefined) {
      outcome = `[3,${stringify(record[0])},${stringify(toWellFormed(record[1]))}]`;
      return;
    }
    const message = describe(error);
    // The stack of an error the engine raised ("" if it has none), else null.
    let stack = "null";
    if (isError(error) && !reflectApply(weakSetHas, made, [error])) {
      stack = '""';
      try {
        const text = reflectApply(stackOf, error, []);
        if (typeof text === "string") stack = stringify(toWellFormed(text));
      } catch {}
    }
    outcome = `[4,${stringify(toWellFormed(message))},${stack}]`;
  };

  const succeed = (value) => {
    if (outcome !== null) return;
    if (value === undefined) {
      outcome = "[2]";
      return;
    }
    try {
      outcome = `[1,${serialize(value, "$", new MapCtor(), 0)}]`;
    } catch (error) {
      const why = whyUnserializable(error);
      if (why === null) fail(error);
      else if (outcome === null) outcome = `[3,"serialization_error",${stringify(toWellFormed(`Guest code returned a non-serializable value: ${why}`))}]`;
    }
  };

  // ---------------------------------------------------------------- the worker's calls
  // `op` is a small integer (guest.py's _START, _POLL, _SETTLE, _ABORT, _BEGIN): a string from the worker
  // would be a new string to make and compare at every call, two of them per tool call.
  const dispatch = (op, a, b, c, d, e, f) => {
    switch (op) {
      // The providers (JSON text `a`) and log limits (`b` lines, `c` characters). `d` names the
      // global through which the worker found this dispatcher; it holds the ring for log lines by
      // now, if there is one (of `e` code units, a power of two; else 0). No guest code has run
      // yet: the typed arrays' constructors are the engine's.
      case 0: { // start
        if (e) ring = [G[d], e, G.Uint32Array, G.Uint16Array];
        delete G[d];
        maxLogLines = b;
        logCharsLeft = c;
        for (const [name, tools] of parse(a)) {
          const namespace = {};
          for (const tool of tools) {
            const proxy = function (input) {
              return callTool(name, tool, input, proxy);
            };
            defineProperty(proxy, "name", { value: tool, configurable: true }); // as the guest knows it
            defineProperty(namespace, tool, { value: proxy, writable: true, enumerable: true, configurable: true });
          }
          hidden.value = namespace;
          defineProperty(G, name, hidden);
        }
        return;
      }
      // The promise `a` of the guest's function, which the worker called after `start` (so that
      // no frame of the bootstrap's is under the guest's in a stack).
      case 4: // begin
        reflectApply(promiseThen, a, [succeed, fail]);
        return;
      // Everything the guest did since the last poll, as one flat JSON text:
      // [calls, logs, outcome-or-null]; calls are [id, provider, tool, hasInput, input].
      case 1: { // poll
        // slice() flattens the rope strings that concatenation builds: the Python
        // binding cannot convert a rope.
        const text = slice(`[[${outbox}],[${logs}],${outcome === null ? "null" : outcome}]`, 0);
        outbox = logs = "";
        return text;
      }
      // Tool call `a` settled: resolved with JSON text `c` (null or undefined for undefined) if `b`,
      // else rejected with code `d` and message `e` (JSON text: it may hold lone surrogates).
      case 2: { // settle
        const callbacks = pending[a];
        if (callbacks === undefined) return;
        delete pending[a];
        if (b) callbacks[0](c === null || c === undefined ? undefined : parse(c));
        else callbacks[1](trustedError(d, parse(e), dispatch));
        return;
      }
      case 3: // abort
        aborting = true;
        outbox = "";
        for (const id in pending) {
          const callbacks = pending[id];
          delete pending[id];
          callbacks[1](trustedError("timeout", TIMEOUT_MESSAGE, dispatch));
        }
        return;
    }
  };
  return dispatch;
})();
