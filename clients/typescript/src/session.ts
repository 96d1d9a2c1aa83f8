import { findUnsafeJson } from "./json.js";
import { checkRunnerMessage } from "./messages.js";
import {
  DEFAULT_RUNTIME_OPTIONS,
  isExecuteErrorCode,
  type DispatcherMessage,
  type DoneMessage,
  type ExecuteError,
  type ExecuteResult,
  type ExecutorRuntimeOptions,
  type HostTransport,
  type ProviderManifest,
  type ResolvedToolDescriptor,
  type ResolvedToolProvider,
  type RunnerMessage,
  type RuntimeLimits,
  type ToolCallMessage,
  type ToolResultMessage,
  type TransportCloseReason,
} from "./types.js";

/** The message of every `timeout` failure. */
export const TIMEOUT_MESSAGE = "Execution timed out";

/** Default time between `cancel` and closing the connection when no `done` comes. */
export const DEFAULT_CANCEL_GRACE_MS = 25;

/** Default margin after `timeoutMs` before the host cancels on its own. */
export const DEFAULT_TIMEOUT_BACKSTOP_MS = 100;

/** Options of {@link runHostSession}. */
export interface HostSessionOptions {
  transport: HostTransport;
  code: string;
  providers: ResolvedToolProvider[];
  /** Limits sent to the runner; missing ones take execbox's defaults. */
  runtimeOptions?: ExecutorRuntimeOptions | undefined;
  /** Aborting it cancels the execution (`timeout` result). */
  signal?: AbortSignal | undefined;
  /** Defaults to a random UUID. */
  executionId?: string | undefined;
  /** Time between `cancel` and closing the connection if no `done` came (25 ms). */
  cancelGraceMs?: number | undefined;
  /** The host cancels at `timeoutMs` plus this (100 ms), in case the runner does not. */
  timeoutBackstopMs?: number | undefined;
  /**
   * Called with each log line, once and in order: from the runner's `log` messages (live logs,
   * when the transport asked for them) and then the `done`'s lines not yet shown. If it throws,
   * the transport is terminated and the result is `internal_error` ("onLog threw: ...").
   */
  onLog?: ((line: string) => void) | undefined;
  /** Called as each tool starts; what it returns is called as the tool ends (with its error code if it failed). */
  onToolStart?: ((providerName: string, safeToolName: string) => (failed?: string) => void) | undefined;
  /**
   * Dispose the transport when the session ends (default `true`). Set `false` to run
   * several executions one after the other on the same connection; the transport is
   * still terminated when the runner has to be cut off.
   */
  disposeTransport?: boolean | undefined;
}

/** A `timeout` failure, as execbox reports cancellation. */
export function timeoutResult(durationMs = 0, logs: string[] = []): ExecuteResult {
  return {
    durationMs,
    error: { code: "timeout", message: TIMEOUT_MESSAGE },
    logs,
    ok: false,
  };
}

/** A `validation_error` failure: the input cannot be run, so nothing was sent. */
export function validationErrorResult(message: string): ExecuteResult {
  return { durationMs: 0, error: { code: "validation_error", message }, logs: [], ok: false };
}

/** An `internal_error` failure. */
export function internalErrorResult(message: string, durationMs = 0): ExecuteResult {
  return {
    durationMs,
    error: { code: "internal_error", message },
    logs: [],
    ok: false,
  };
}

/** The limits after defaults: `overrides`, then `base`, then execbox's defaults. */
export function resolveRuntimeOptions(
  base: ExecutorRuntimeOptions = {},
  overrides: ExecutorRuntimeOptions = {},
): RuntimeLimits {
  return {
    maxLogChars:
      overrides.maxLogChars ?? base.maxLogChars ?? DEFAULT_RUNTIME_OPTIONS.maxLogChars,
    maxLogLines:
      overrides.maxLogLines ?? base.maxLogLines ?? DEFAULT_RUNTIME_OPTIONS.maxLogLines,
    memoryLimitBytes:
      overrides.memoryLimitBytes ??
      base.memoryLimitBytes ??
      DEFAULT_RUNTIME_OPTIONS.memoryLimitBytes,
    timeoutMs: overrides.timeoutMs ?? base.timeoutMs ?? DEFAULT_RUNTIME_OPTIONS.timeoutMs,
  };
}

/**
 * Why these limits cannot be sent (each must be a finite number, at least 0), or
 * `undefined` when they can.
 */
export function checkRuntimeOptions(options: RuntimeLimits): string | undefined {
  for (const key of ["timeoutMs", "memoryLimitBytes", "maxLogLines", "maxLogChars"] as const) {
    const value: unknown = options[key];
    if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
      return `${key} must be a finite number, at least 0 (got ${String(value)})`;
    }
  }
  return undefined;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null;
}

/**
 * Why an execution's input cannot be run, or `undefined` when it can: the limits (as
 * {@link checkRuntimeOptions}), `providers` (an array of resolved providers) and `signal` (an
 * `AbortSignal`). Plain JavaScript callers get this answer instead of a `TypeError`.
 */
export function checkExecutionInput(
  providers: unknown,
  runtimeOptions: RuntimeLimits,
  signal: unknown,
): string | undefined {
  if (!Array.isArray(providers)) {
    return "providers must be an array of resolved providers (execbox's resolveProvider or defineProvider)";
  }
  const index = providers.findIndex(
    (provider) => !isObject(provider) || typeof provider.name !== "string" || !isObject(provider.tools),
  );
  if (index >= 0) {
    return `providers[${index}] is not a resolved provider: it needs a string name and an object of tools`;
  }
  if (
    signal !== undefined &&
    !(isObject(signal) && typeof signal.aborted === "boolean" && typeof signal.addEventListener === "function")
  ) {
    return "signal must be an AbortSignal";
  }
  return checkRuntimeOptions(runtimeOptions);
}

/** Runs a transport's `dispose` or `terminate` without waiting for it or letting it throw. */
function closeQuietly(close: () => Promise<void> | void): void {
  void Promise.resolve().then(close).catch(() => {});
}

/** The metadata the runner gets: names, descriptions and types, never closures. */
export function toProviderManifests(providers: ResolvedToolProvider[]): ProviderManifest[] {
  return providers.map((provider) => {
    const tools: ProviderManifest["tools"] = {};
    for (const [safeName, tool] of Object.entries(provider.tools)) {
      tools[safeName] = {
        ...(tool.description === undefined ? {} : { description: tool.description }),
        originalName: tool.originalName,
        safeName: tool.safeName,
      };
    }
    return { name: provider.name, tools, types: provider.types };
  });
}

/** A thrown value's message: an Error's, an object's string `message`, else the value as a string. */
export function messageOf(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  if (typeof error === "object" && error !== null && "message" in error) {
    const { message } = error as { message: unknown };
    if (typeof message === "string") {
      return message;
    }
  }
  return String(error);
}

/** The answer for a thrown value: its own code if it is an ExecuteFailure, else tool_error. */
function toolFailure(error: unknown): ExecuteError {
  if (
    error instanceof Error &&
    error.name === "ExecuteFailure" &&
    isExecuteErrorCode((error as { code?: unknown }).code)
  ) {
    return {
      code: (error as unknown as { code: ExecuteError["code"] }).code,
      message: error.message,
    };
  }
  return { code: "tool_error", message: messageOf(error) };
}

function ownValue<T>(record: Record<string, T>, key: string): T | undefined {
  return Object.prototype.hasOwnProperty.call(record, key) ? record[key] : undefined;
}

function toResult(message: DoneMessage): ExecuteResult {
  if (message.ok) {
    return {
      durationMs: message.durationMs,
      logs: message.logs,
      ok: true,
      result: message.result,
    };
  }
  return {
    durationMs: message.durationMs,
    error: { code: message.error.code, message: message.error.message },
    logs: message.logs,
    ok: false,
  };
}

/**
 * Runs one execution over a connected transport: sends `execute`, answers every
 * `tool_call` with the matching tool, and resolves with the runner's `done`.
 *
 * It never rejects. A `signal` abort, or `timeoutMs` + `timeoutBackstopMs` without a
 * `done`, sends `cancel`; if no `done` follows within `cancelGraceMs` the transport is
 * terminated and the result is a `timeout` failure. A transport that fails or closes
 * first gives an `internal_error` failure (`timeout` once cancellation has begun).
 */
export function runHostSession(options: HostSessionOptions): Promise<ExecuteResult> {
  const { transport, signal } = options;
  const runtimeOptions = resolveRuntimeOptions(options.runtimeOptions);
  const disposeTransport = options.disposeTransport ?? true;
  const invalid = checkExecutionInput(options.providers, runtimeOptions, signal);
  if (invalid !== undefined) {
    if (disposeTransport) {
      closeQuietly(() => transport.dispose());
    }
    return Promise.resolve(validationErrorResult(invalid));
  }
  const executionId = options.executionId ?? globalThis.crypto.randomUUID();
  const cancelGraceMs = options.cancelGraceMs ?? DEFAULT_CANCEL_GRACE_MS;
  const backstopMs = options.timeoutBackstopMs ?? DEFAULT_TIMEOUT_BACKSTOP_MS;
  const providers = new Map<string, ResolvedToolProvider>();
  for (const provider of options.providers) {
    providers.set(provider.name, provider);
  }
  // Aborted when the session ends: the tools' context.signal.
  const toolController = new AbortController();
  const startedAt = Date.now();

  const onLog = options.onLog;
  let shownLines = 0;

  return new Promise<ExecuteResult>((resolve) => {
    let finished = false;
    let cancelling = false;
    let graceTimer: ReturnType<typeof setTimeout> | undefined;
    let unsubscribe: Array<() => void> = [];

    const finish = (result: ExecuteResult, cutOff = false): void => {
      if (finished) {
        return;
      }
      finished = true;
      clearTimeout(backstopTimer);
      clearTimeout(graceTimer);
      for (const off of unsubscribe) {
        off();
      }
      unsubscribe = [];
      signal?.removeEventListener("abort", onAbort);
      toolController.abort();
      if (cutOff) {
        closeQuietly(() => transport.terminate());
      } else if (disposeTransport) {
        closeQuietly(() => transport.dispose());
      }
      resolve(result);
    };

    // Gives lines to onLog; one that throws ends the session (its error cannot escape into the socket's events).
    const show = (lines: string[]): boolean => {
      shownLines += lines.length;
      try {
        for (const line of lines) {
          onLog?.(line);
        }
        return true;
      } catch (error) {
        finish(internalErrorResult(`onLog threw: ${messageOf(error)}`, Date.now() - startedAt), true);
        return false;
      }
    };

    const fail = (message: string): void => {
      finish(
        cancelling
          ? timeoutResult(Date.now() - startedAt)
          : internalErrorResult(message, Date.now() - startedAt),
        true,
      );
    };

    const send = (message: DispatcherMessage): void => {
      if (finished) {
        return;
      }
      try {
        void Promise.resolve(transport.send(message)).catch((error: unknown) => {
          if (!finished) {
            fail(`Could not send to the runner: ${messageOf(error)}`);
          }
        });
      } catch (error) {
        fail(`Could not send to the runner: ${messageOf(error)}`);
      }
    };

    const cancel = (): void => {
      if (finished || cancelling) {
        return;
      }
      cancelling = true;
      toolController.abort();
      send({ type: "cancel", id: executionId });
      graceTimer = setTimeout(() => {
        finish(timeoutResult(Date.now() - startedAt), true);
      }, cancelGraceMs);
    };

    const callTool = async (
      message: ToolCallMessage,
    ): Promise<{ ok: true; result: unknown } | { ok: false; error: ExecuteError }> => {
      const provider = providers.get(message.providerName);
      const tool: ResolvedToolDescriptor | undefined = provider
        ? ownValue(provider.tools, message.safeToolName)
        : undefined;
      if (!provider || !tool) {
        return {
          ok: false,
          error: {
            code: "internal_error",
            message: `Unknown tool ${message.providerName}.${message.safeToolName}`,
          },
        };
      }
      if (toolController.signal.aborted) {
        return { ok: false, error: { code: "timeout", message: TIMEOUT_MESSAGE } };
      }
      const ended = options.onToolStart?.(provider.name, tool.safeName);
      const answer = await runTool(provider, tool, message);
      ended?.(answer.ok ? undefined : answer.error.code);
      return answer;
    };

    const runTool = async (
      provider: ResolvedToolProvider,
      tool: ResolvedToolDescriptor,
      message: ToolCallMessage,
    ): Promise<{ ok: true; result: unknown } | { ok: false; error: ExecuteError }> => {
      try {
        const result = await tool.execute(message.input, {
          originalToolName: tool.originalName,
          providerName: provider.name,
          safeToolName: tool.safeName,
          signal: toolController.signal,
        });
        const problem = findUnsafeJson(result);
        if (problem !== undefined) {
          return {
            ok: false,
            error: {
              code: "serialization_error",
              message: `Tool ${tool.originalName} returned a non-serializable value: ${problem}`,
            },
          };
        }
        return { ok: true, result };
      } catch (error) {
        return { ok: false, error: toolFailure(error) };
      }
    };

    const onMessage = (received: RunnerMessage): void => {
      if (finished) {
        return;
      }
      // Checked again here, since the transport may be any HostTransport.
      const message = checkRunnerMessage(received);
      if (typeof message === "string") {
        fail(`The runner sent an invalid message: ${message}`);
        return;
      }
      switch (message?.type) {
        case "started":
          return;
        case "tool_call": {
          const { callId } = message;
          void callTool(message).then((answer) => {
            const reply: ToolResultMessage = answer.ok
              ? answer.result === undefined
                ? ({ type: "tool_result", callId, ok: true } as ToolResultMessage)
                : { type: "tool_result", callId, ok: true, result: answer.result }
              : { type: "tool_result", callId, ok: false, error: answer.error };
            send(reply);
          });
          return;
        }
        case "log":
          if (message.id === executionId) {
            show(message.lines);
          }
          return;
        case "done":
          if (message.id === executionId) {
            // All of them, from a runner without live logs.
            if (show(message.logs.slice(shownLines))) {
              finish(toResult(message));
            }
          }
          return;
        default:
          return;
      }
    };

    const onError = (error: Error): void => {
      fail(error.message);
    };

    const onClose = (reason?: TransportCloseReason): void => {
      fail(reason?.message ?? "The runner closed the connection before the execution finished");
    };

    const onAbort = (): void => {
      cancel();
    };

    // setTimeout fires at once beyond 2^31 - 1 ms; the runner refuses such budgets anyway.
    const backstopTimer = setTimeout(
      cancel,
      Math.min(runtimeOptions.timeoutMs + backstopMs, 2 ** 31 - 1),
    );
    unsubscribe = [
      transport.onMessage(onMessage),
      transport.onError(onError),
      transport.onClose(onClose),
    ];

    if (signal?.aborted) {
      // Nothing was sent yet: no runner work to stop.
      finish(timeoutResult());
      return;
    }
    signal?.addEventListener("abort", onAbort, { once: true });

    send({
      type: "execute",
      id: executionId,
      code: options.code,
      options: runtimeOptions,
      providers: toProviderManifests(options.providers),
    });
  });
}
