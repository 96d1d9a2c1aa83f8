/**
 * @packageDocumentation
 * Client for execbox-runner: run guest JavaScript on a remote runner from an execbox
 * host. {@link RunnerExecutor} is a drop-in execbox `Executor`;
 * {@link connectWebSocketTransport} gives a `HostTransport` for hosts that drive
 * execbox's `runHostTransportSession` themselves.
 */
export { RunnerExecutor, type RunnerExecutorOptions } from "./executor.js";
export {
  connectWebSocketTransport,
  RunnerConnectionError,
  type ConnectOptions,
  type TlsOptions,
  type WebSocketConstructorLike,
  type WebSocketHostTransport,
  type WebSocketLike,
} from "./transport.js";
export {
  checkRuntimeOptions,
  DEFAULT_CANCEL_GRACE_MS,
  DEFAULT_TIMEOUT_BACKSTOP_MS,
  resolveRuntimeOptions,
  runHostSession,
  TIMEOUT_MESSAGE,
  toProviderManifests,
  type HostSessionOptions,
} from "./session.js";
export { checkRunnerMessage } from "./messages.js";
export { findUnsafeJson } from "./json.js";
export {
  defineProvider,
  toSafeName,
  type ProviderDefinition,
  type ToolDefinition,
} from "./provider.js";
export { type Schema, type SchemaType, type StandardResult, type StandardSchema } from "./schemas.js";
export {
  DEFAULT_RUNTIME_OPTIONS,
  ExecuteFailure,
  isExecuteErrorCode,
  LIVE_LOGS_HEADER,
  type CancelMessage,
  type DispatcherMessage,
  type DoneMessage,
  type ExecuteError,
  type ExecuteErrorCode,
  type ExecuteMessage,
  type ExecuteResult,
  type ExecutionOptions,
  type Executor,
  type ExecutorRuntimeOptions,
  type RuntimeLimits,
  type HostTransport,
  type LogMessage,
  type ProviderManifest,
  type ProviderToolManifest,
  type ResolvedToolDescriptor,
  type ResolvedToolProvider,
  type RunnerMessage,
  type StartedMessage,
  type ToolCallMessage,
  type ToolExecutionContext,
  type ToolResultMessage,
  type TransportCloseReason,
} from "./types.js";
