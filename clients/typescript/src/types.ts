/**
 * The execbox shapes this package works with, declared structurally.
 *
 * They match `@execbox/core` (Executor, ExecuteResult, ExecutionOptions,
 * ResolvedToolProvider, ...) and its protocol entry point (HostTransport and the
 * runner messages), so values from an execbox host can be passed in and values from
 * here can be passed to execbox, without this package depending on execbox.
 */

/** The stable error codes of the execbox runner protocol. */
export type ExecuteErrorCode =
  | "timeout"
  | "memory_limit"
  | "validation_error"
  | "tool_error"
  | "runtime_error"
  | "serialization_error"
  | "internal_error";

/** A structured execution failure. */
export interface ExecuteError {
  code: ExecuteErrorCode;
  message: string;
}

/** What every execution resolves to: never a rejection. */
export type ExecuteResult<T = unknown> =
  | {
      durationMs: number;
      logs: string[];
      ok: true;
      result: T;
    }
  | {
      durationMs: number;
      error: ExecuteError;
      logs: string[];
      ok: false;
    };

/** Limits sent to the runner with each execution. */
export interface ExecutorRuntimeOptions {
  maxLogChars?: number | undefined;
  maxLogLines?: number | undefined;
  memoryLimitBytes?: number | undefined;
  timeoutMs?: number | undefined;
}

/** The limits with every one set, as an `execute` carries them. */
export type RuntimeLimits = { [K in keyof ExecutorRuntimeOptions]-?: number };

/** Per-call options of {@link Executor.execute}. */
export interface ExecutionOptions extends ExecutorRuntimeOptions {
  /** Aborting it cancels the execution; the result is then a `timeout` failure. */
  signal?: AbortSignal | undefined;
  /**
   * Called with each line the guest logs, once and in order: as it is written when the runner
   * offers live logs (execbox-runner does), else all when the execution ends. The result's
   * `logs` has the same lines. If it throws, the execution ends with `internal_error`.
   */
  onLog?: ((line: string) => void) | undefined;
}

/** Passed to a tool's `execute` with every call. */
export interface ToolExecutionContext {
  /** Aborted when the execution ends, times out or is cancelled. */
  signal: AbortSignal;
  providerName: string;
  safeToolName: string;
  originalToolName: string;
}

/** One tool of a resolved provider (execbox's `ResolvedToolDescriptor`). */
export interface ResolvedToolDescriptor {
  description?: string | undefined;
  inputSchema?: Record<string, unknown> | undefined;
  outputSchema?: Record<string, unknown> | undefined;
  originalName: string;
  safeName: string;
  execute: (input: unknown, context: ToolExecutionContext) => Promise<unknown>;
}

/** A guest namespace of tools (execbox's `ResolvedToolProvider`). */
export interface ResolvedToolProvider {
  name: string;
  originalToSafeName: Record<string, string>;
  safeToOriginalName: Record<string, string>;
  /** Keyed by safe name. */
  tools: Record<string, ResolvedToolDescriptor>;
  types: string;
}

/** execbox's `Executor` interface. */
export interface Executor {
  execute(
    code: string,
    providers: ResolvedToolProvider[],
    options?: ExecutionOptions,
  ): Promise<ExecuteResult>;
  dispose?(): Promise<void> | void;
  prewarm?(count?: number): Promise<void>;
}

/** Metadata of one tool as the runner sees it. */
export interface ProviderToolManifest {
  description?: string;
  originalName: string;
  safeName: string;
}

/** Metadata of one provider as the runner sees it: no closures, no secrets. */
export interface ProviderManifest {
  name: string;
  tools: Record<string, ProviderToolManifest>;
  types: string;
}

/** Host to runner: start an execution. */
export interface ExecuteMessage {
  type: "execute";
  id: string;
  code: string;
  options: RuntimeLimits;
  providers: ProviderManifest[];
}

/** Host to runner: stop the active execution. */
export interface CancelMessage {
  type: "cancel";
  id: string;
}

/** Host to runner: the answer to one `tool_call`. */
export type ToolResultMessage = {
  type: "tool_result";
  callId: string;
} & ({ ok: true; result: unknown } | { ok: false; error: ExecuteError });

/** Everything a host sends. */
export type DispatcherMessage = ExecuteMessage | CancelMessage | ToolResultMessage;

/** Runner to host: the execution was accepted. */
export interface StartedMessage {
  type: "started";
  id: string;
}

/**
 * Runner to host: guest code called a tool. The transport in this package always
 * sets the `input` key (to `undefined` when the runner omitted it).
 */
export interface ToolCallMessage {
  type: "tool_call";
  callId: string;
  providerName: string;
  safeToolName: string;
  input: unknown;
}

/** Runner to host: the execution's outcome. */
export type DoneMessage =
  | {
      type: "done";
      id: string;
      ok: true;
      durationMs: number;
      logs: string[];
      result?: unknown;
    }
  | {
      type: "done";
      id: string;
      ok: false;
      durationMs: number;
      logs: string[];
      error: ExecuteError;
    };

/** Everything a runner sends. */
export type RunnerMessage = StartedMessage | ToolCallMessage | DoneMessage;

/**
 * Runner to host, only for a host that asked for live logs at the handshake
 * (`Execbox-Extensions: live-logs`): lines the guest logged, while it runs. The lines of an
 * execution's `log` messages, in order, are exactly its `done.logs`.
 */
export interface LogMessage {
  type: "log";
  id: string;
  lines: string[];
}

/** The handshake header and value that ask a runner for live logs. */
export const LIVE_LOGS_HEADER = { "Execbox-Extensions": "live-logs" } as const;

/**
 * Why a transport closed before the session finished. (execbox's own type also has
 * a Node `signal` for process transports; it is left out here so that this package's
 * declarations need no Node types, and the two stay assignable both ways.)
 */
export interface TransportCloseReason {
  code?: number | null;
  message: string;
}

/** execbox's `HostTransport`: one connection to one runner. */
export interface HostTransport {
  dispose(): Promise<void> | void;
  onClose(handler: (reason?: TransportCloseReason) => void): () => void;
  onError(handler: (error: Error) => void): () => void;
  onMessage(handler: (message: RunnerMessage) => void): () => void;
  send(message: DispatcherMessage): Promise<void> | void;
  terminate(): Promise<void> | void;
}

/** The default limits, the same as execbox's. */
export const DEFAULT_RUNTIME_OPTIONS: Readonly<RuntimeLimits> =
  Object.freeze({
    maxLogChars: 64_000,
    maxLogLines: 100,
    memoryLimitBytes: 64 * 1024 * 1024,
    timeoutMs: 5_000,
  });

const ERROR_CODES: ReadonlySet<string> = new Set<ExecuteErrorCode>([
  "timeout",
  "memory_limit",
  "validation_error",
  "tool_error",
  "runtime_error",
  "serialization_error",
  "internal_error",
]);

/** Whether `value` is one of the stable error codes. */
export function isExecuteErrorCode(value: unknown): value is ExecuteErrorCode {
  return typeof value === "string" && ERROR_CODES.has(value);
}

/**
 * A tool failure with a chosen stable code. Throw it from a tool to answer the guest
 * with that code (for example `validation_error`); any other thrown value answers
 * `tool_error`. execbox's own `ExecuteFailure` is recognised the same way (by its
 * name and a known code).
 */
export class ExecuteFailure extends Error {
  readonly code: ExecuteErrorCode;

  constructor(code: ExecuteErrorCode, message: string) {
    super(message);
    this.code = code;
    this.name = "ExecuteFailure";
  }
}
