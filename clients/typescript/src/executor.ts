import {
  checkExecutionInput,
  internalErrorResult,
  messageOf,
  resolveRuntimeOptions,
  runHostSession,
  timeoutResult,
  validationErrorResult,
} from "./session.js";
import { startExecutionTrace } from "./tracing.js";
import { connectWebSocketTransport, RunnerConnectionError, type ConnectOptions } from "./transport.js";
import {
  LIVE_LOGS_HEADER,
  type ExecuteResult,
  type ExecutionOptions,
  type Executor,
  type ExecutorRuntimeOptions,
  type HostTransport,
  type ResolvedToolProvider,
} from "./types.js";

/** Options of {@link RunnerExecutor}. */
export interface RunnerExecutorOptions
  extends ExecutorRuntimeOptions,
    Omit<ConnectOptions, "url" | "signal"> {
  /** The runner, `ws://host:port/` or `wss://host:port/`. Required unless `connectTransport` is given. */
  url?: string | URL | undefined;
  /**
   * Opens the connection for one execution instead of `url` (any execbox
   * `HostTransport`, as `@execbox/remote`'s `connectTransport` did).
   */
  connectTransport?: (() => HostTransport | Promise<HostTransport>) | undefined;
  /** Time between `cancel` and closing the connection if no `done` came (default 25 ms). */
  cancelGraceMs?: number | undefined;
  /** The host cancels at `timeoutMs` plus this, in case the runner does not (default 100 ms). */
  timeoutBackstopMs?: number | undefined;
  /** `onLog` for every execution that does not pass its own (see `ExecutionOptions.onLog`). */
  onLog?: ((line: string) => void) | undefined;
  /**
   * A handshake refused as busy (503) or over a tenant's quota (429) is tried again up to this many
   * times (default 0), after the runner's `Retry-After` (at most 30 s) or a doubling backoff from
   * 250 ms. Nothing runs when a handshake is refused, so a retry never runs code twice. A wait that
   * would end after the execution's `timeoutMs` (counted from `execute`) is not made: the refusal
   * is the result at once.
   */
  retries?: number | undefined;
}

const RETRY_BACKOFF_MS = 250;
const MAX_RETRY_WAIT_MS = 30_000;

/** Resolves after `ms`, or at once when `signal` aborts. */
function abortableSleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });
}

interface Active {
  controller: AbortController;
  settled: Promise<unknown>;
}

/**
 * An execbox `Executor` that runs code on an execbox-runner daemon: each execution
 * opens its own connection, so executions run concurrently.
 *
 * `execute` never rejects: refusals, lost connections and runner failures are
 * `ok: false` results.
 */
export class RunnerExecutor implements Executor {
  readonly #options: RunnerExecutorOptions;
  readonly #active = new Set<Active>();
  readonly #closing = new Set<Promise<unknown>>();
  #disposed = false;

  constructor(options: RunnerExecutorOptions) {
    if (options.url === undefined && options.connectTransport === undefined) {
      throw new TypeError("RunnerExecutor needs a url (or a connectTransport function)");
    }
    this.#options = { ...options };
  }

  /** Runs `code` with `providers`' tools; see execbox's `Executor.execute`. */
  async execute(
    code: string,
    providers: ResolvedToolProvider[],
    given: ExecutionOptions = {},
  ): Promise<ExecuteResult> {
    if (this.#disposed) {
      return internalErrorResult("This RunnerExecutor has been disposed");
    }
    const options = given ?? {}; // null, from plain JavaScript
    const runtimeOptions = resolveRuntimeOptions(this.#options, options);
    const invalid = checkExecutionInput(providers, runtimeOptions, options.signal);
    if (invalid !== undefined) {
      return validationErrorResult(invalid);
    }
    if (options.signal?.aborted) {
      return timeoutResult();
    }
    const controller = new AbortController();
    const onAbort = (): void => controller.abort();
    options.signal?.addEventListener("abort", onAbort, { once: true });
    let release: () => void = () => {};
    const entry: Active = {
      controller,
      settled: new Promise<void>((resolve) => {
        release = resolve;
      }),
    };
    this.#active.add(entry);
    const startedAt = Date.now();
    const onLog = options.onLog ?? this.#options.onLog;
    const executionId = globalThis.crypto.randomUUID();
    const trace = await startExecutionTrace(executionId);
    let result: ExecuteResult | undefined;
    try {
      let transport: HostTransport;
      try {
        transport = await this.#open(
          controller.signal,
          startedAt + runtimeOptions.timeoutMs,
          onLog !== undefined,
          trace?.headers ?? {},
        );
      } catch (error) {
        result = controller.signal.aborted
          ? timeoutResult(Date.now() - startedAt)
          : internalErrorResult(messageOf(error), Date.now() - startedAt);
        return result;
      }
      try {
        result = await runHostSession({
          transport,
          code,
          providers,
          runtimeOptions,
          executionId,
          signal: controller.signal,
          ...(onLog === undefined ? {} : { onLog }),
          ...(trace === undefined ? {} : { onToolStart: (provider, tool) => trace.tool(provider, tool) }),
          ...(this.#options.cancelGraceMs === undefined
            ? {}
            : { cancelGraceMs: this.#options.cancelGraceMs }),
          ...(this.#options.timeoutBackstopMs === undefined
            ? {}
            : { timeoutBackstopMs: this.#options.timeoutBackstopMs }),
          disposeTransport: false,
        });
        return result;
      } finally {
        this.#track(Promise.resolve().then(() => transport.dispose()));
      }
    } finally {
      trace?.end(result?.ok ?? false, result === undefined || result.ok ? undefined : result.error.code);
      options.signal?.removeEventListener("abort", onAbort);
      this.#active.delete(entry);
      release();
    }
  }

  /**
   * Cancels running executions (they resolve as `timeout` failures), waits for them
   * and for their connections to close, and refuses later executions.
   */
  async dispose(): Promise<void> {
    this.#disposed = true;
    const active = [...this.#active];
    for (const entry of active) {
      entry.controller.abort();
    }
    await Promise.allSettled(active.map((entry) => entry.settled));
    await Promise.allSettled([...this.#closing]);
  }

  #track(closing: Promise<unknown>): void {
    const tracked = closing.catch(() => {});
    this.#closing.add(tracked);
    void tracked.then(() => this.#closing.delete(tracked));
  }

  /** The execution's connection; refused handshakes retried as `retries` says, waiting no later than `retryBy`. */
  async #open(
    signal: AbortSignal,
    retryBy: number,
    liveLogs: boolean,
    traceHeaders: Record<string, string>,
  ): Promise<HostTransport> {
    const { url, connectTransport } = this.#options;
    if (connectTransport === undefined) {
      const headers = { ...this.#options.headers, ...traceHeaders, ...(liveLogs ? LIVE_LOGS_HEADER : {}) };
      for (let attempt = 0; ; attempt += 1) {
        try {
          return await connectWebSocketTransport({ ...this.#options, url: url!, signal, headers });
        } catch (error) {
          const retryable = error instanceof RunnerConnectionError && (error.status === 429 || error.status === 503);
          if (!retryable || attempt >= (this.#options.retries ?? 0) || signal.aborted) {
            throw error;
          }
          const waitMs = Math.min(
            error.retryAfterSeconds !== undefined ? error.retryAfterSeconds * 1000 : RETRY_BACKOFF_MS * 2 ** attempt,
            MAX_RETRY_WAIT_MS,
          );
          if (Date.now() + waitMs > retryBy) {
            throw error;
          }
          await abortableSleep(waitMs, signal);
        }
      }
    }
    // A caller's factory cannot be aborted: if the signal wins, close what it gives later.
    const opening = Promise.resolve().then(connectTransport);
    return await new Promise<HostTransport>((resolve, reject) => {
      const onAbort = (): void => {
        reject(new Error("Connecting to the runner was aborted"));
        this.#track(opening.then((transport) => transport.dispose()));
      };
      if (signal.aborted) {
        onAbort();
        return;
      }
      signal.addEventListener("abort", onAbort, { once: true });
      opening.then(
        (transport) => {
          signal.removeEventListener("abort", onAbort);
          if (signal.aborted) {
            return;
          }
          resolve(transport);
        },
        (error: unknown) => {
          signal.removeEventListener("abort", onAbort);
          reject(error instanceof Error ? error : new Error(String(error)));
        },
      );
    });
  }
}
