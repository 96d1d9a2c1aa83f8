import { isExecuteErrorCode, type LogMessage, type RunnerMessage } from "./types.js";

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/**
 * Checks a decoded runner frame. Returns the message (with `input` always present on
 * a `tool_call`, `undefined` when the runner omitted it, and `result` always present
 * on a successful `done`), a string saying what is wrong with a malformed message of a
 * known type, or `undefined` for a message of an unknown type (to be ignored). `log` (the
 * live-logs extension) is known: a runner sends it only to a host that asked for it.
 */
export function checkRunnerMessage(value: unknown): RunnerMessage | LogMessage | string | undefined {
  if (!isRecord(value) || typeof value.type !== "string") {
    return "a runner message must be an object with a string type";
  }
  switch (value.type) {
    case "started":
      return typeof value.id === "string"
        ? { type: "started", id: value.id }
        : "started without a string id";
    case "tool_call":
      if (
        typeof value.callId !== "string" ||
        typeof value.providerName !== "string" ||
        typeof value.safeToolName !== "string"
      ) {
        return "tool_call without string callId, providerName and safeToolName";
      }
      // The specification lets a runner omit `input` for undefined: keep the key, so
      // that hosts checking `"input" in message` (execbox's own guard) accept it.
      return {
        type: "tool_call",
        callId: value.callId,
        providerName: value.providerName,
        safeToolName: value.safeToolName,
        input: value.input,
      };
    case "done": {
      if (typeof value.id !== "string") {
        return "done without a string id";
      }
      if (typeof value.durationMs !== "number" || !Number.isFinite(value.durationMs)) {
        return "done without a finite durationMs";
      }
      const logs = value.logs;
      if (!Array.isArray(logs) || !logs.every((line) => typeof line === "string")) {
        return "done without string logs";
      }
      if (value.ok === true) {
        return {
          type: "done",
          id: value.id,
          ok: true,
          durationMs: value.durationMs,
          logs: logs as string[],
          result: value.result,
        };
      }
      const error = value.error;
      if (
        value.ok !== false ||
        !isRecord(error) ||
        !isExecuteErrorCode(error.code) ||
        typeof error.message !== "string"
      ) {
        return "done without ok, or a failing done without a known error code and message";
      }
      return {
        type: "done",
        id: value.id,
        ok: false,
        durationMs: value.durationMs,
        logs: logs as string[],
        error: { code: error.code, message: error.message },
      };
    }
    case "log": {
      const lines = value.lines;
      if (typeof value.id !== "string" || !Array.isArray(lines) || !lines.every((line) => typeof line === "string")) {
        return "log without a string id and string lines";
      }
      return { type: "log", id: value.id, lines: lines as string[] };
    }
    default:
      return undefined;
  }
}
