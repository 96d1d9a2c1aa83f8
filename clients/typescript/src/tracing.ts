/**
 * Host-side OpenTelemetry spans, when `@opentelemetry/api` is installed (an optional peer
 * dependency): one span per execution (`execbox.execute`), whose `traceparent` goes to the runner
 * in the handshake so the runner's spans join the same trace, and one per tool the host runs
 * (`execbox.tool`). Which tracer provider records them is the application's choice; without the
 * package nothing is loaded.
 */

type OtelApi = typeof import("@opentelemetry/api");

let loading: Promise<OtelApi | undefined> | undefined;

function otel(): Promise<OtelApi | undefined> {
  loading ??= import("@opentelemetry/api").catch(() => undefined);
  return loading;
}

/** One execution's span: the headers that carry it, a span per tool, and its end. */
export interface ExecutionTrace {
  /** `traceparent` (and `tracestate`) for the handshake; empty without a recording span. */
  headers: Record<string, string>;
  /** Starts a tool's span, a child of the execution's; returns what ends it. */
  tool(providerName: string, safeToolName: string): (failed?: string) => void;
  /** Ends the execution's span with its outcome. */
  end(ok: boolean, errorCode?: string): void;
}

/** The span of one execution, or `undefined` when OpenTelemetry's API is not installed. */
export async function startExecutionTrace(executionId: string): Promise<ExecutionTrace | undefined> {
  const api = await otel();
  if (api === undefined) {
    return undefined;
  }
  const tracer = api.trace.getTracer("@execbox-runner/client");
  const span = tracer.startSpan("execbox.execute", {
    kind: api.SpanKind.CLIENT,
    attributes: { "execbox.execution_id": executionId },
  });
  const inside = api.trace.setSpan(api.context.active(), span);
  const headers: Record<string, string> = {};
  api.propagation.inject(inside, headers);
  return {
    headers,
    tool(providerName, safeToolName) {
      const tool = tracer.startSpan(
        "execbox.tool",
        { attributes: { "execbox.tool": `${providerName}.${safeToolName}` } },
        inside,
      );
      return (failed) => {
        if (failed !== undefined) {
          tool.setStatus({ code: api.SpanStatusCode.ERROR, message: failed });
        }
        tool.end();
      };
    },
    end(ok, errorCode) {
      span.setAttribute("execbox.outcome", ok ? "ok" : "error");
      if (errorCode !== undefined) {
        span.setAttribute("execbox.error_code", errorCode);
        span.setStatus({ code: api.SpanStatusCode.ERROR, message: errorCode });
      }
      span.end();
    },
  };
}
