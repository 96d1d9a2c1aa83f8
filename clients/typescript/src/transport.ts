import { checkRunnerMessage } from "./messages.js";
import { messageOf } from "./session.js";
import type {
  DispatcherMessage,
  HostTransport,
  RunnerMessage,
  TransportCloseReason,
} from "./types.js";

/** TLS settings for `wss://` with the `ws` package (ignored by a platform WebSocket). */
export interface TlsOptions {
  /** Trusted CA certificates (PEM), for a runner with a private or self-signed certificate. */
  ca?: string | Uint8Array | Array<string | Uint8Array> | undefined;
  /** Client certificate and key (PEM), if the runner's proxy asks for one. */
  cert?: string | Uint8Array | undefined;
  key?: string | Uint8Array | undefined;
  /** Defaults to `true`; `false` accepts any certificate (for tests only). */
  rejectUnauthorized?: boolean | undefined;
  /** Server name for SNI and certificate checks, if not the URL's host. */
  servername?: string | undefined;
}

/**
 * The part of a WHATWG `WebSocket` this package uses, for a platform WebSocket
 * (browsers, Deno, Bun, Node 22+) given as {@link ConnectOptions.WebSocket}.
 */
export interface WebSocketLike {
  readonly readyState: number;
  binaryType: string;
  send(data: string): void;
  close(code?: number, reason?: string): void;
  addEventListener(type: string, listener: (event: any) => void): void;
}

/** A WHATWG `WebSocket` constructor. */
export type WebSocketConstructorLike = new (
  url: string,
  protocolsOrInit?: string | string[] | { headers?: Record<string, string> },
) => WebSocketLike;

/** How to reach a runner. */
export interface ConnectOptions {
  /** `ws://host:port/` or `wss://host:port/`. */
  url: string | URL;
  /** Sent as `Authorization: Bearer <token>`: printable ASCII without spaces, not empty. */
  token?: string | undefined;
  /** Extra handshake headers. */
  headers?: Record<string, string> | undefined;
  /** Bound on the WebSocket handshake, TLS included (default 10,000 ms). */
  connectTimeoutMs?: number | undefined;
  /** How long `dispose()` waits for the closing handshake before dropping the socket (default 1,000 ms). */
  closeTimeoutMs?: number | undefined;
  /** TLS settings for `wss://` (with `ws`). */
  tls?: TlsOptions | undefined;
  /** Largest accepted runner message in bytes (with `ws`; default 64 MiB). */
  maxPayload?: number | undefined;
  /**
   * A WHATWG WebSocket constructor to use instead of the `ws` package, such as
   * `globalThis.WebSocket`. Headers (the token) are passed as `{ headers }`, which
   * Node 22+ (undici), Bun and Deno accept and browsers do not.
   */
  WebSocket?: WebSocketConstructorLike | undefined;
  /** Aborts connecting. */
  signal?: AbortSignal | undefined;
}

/** The runner could not be reached, or refused the handshake. */
export class RunnerConnectionError extends Error {
  /** The HTTP status of a refused handshake (401 no or wrong token, 403 origin, 429 a tenant's quota, 503 busy or draining). */
  readonly status: number | undefined;
  /** The runner's `Retry-After` in seconds, with a 429 or a 503. */
  readonly retryAfterSeconds: number | undefined;
  /** With a 429: the quota the tenant is at (`max_sessions`, `executions_per_minute`, ...), as the runner named it. */
  readonly quota: string | undefined;

  constructor(message: string, status?: number, retryAfterSeconds?: number, quota?: string) {
    super(message);
    this.name = "RunnerConnectionError";
    this.status = status;
    this.retryAfterSeconds = retryAfterSeconds;
    this.quota = quota;
  }
}

/** A {@link HostTransport} over one WebSocket connection. */
export interface WebSocketHostTransport extends HostTransport {
  /** The runner's URL. */
  readonly url: string;
  /** Whether the connection has closed. */
  readonly closed: boolean;
  /** Closes the connection (code 1000), bounded by `closeTimeoutMs`; resolves once it is closed. */
  dispose(): Promise<void>;
  /** Drops the connection at once. */
  terminate(): void;
  send(message: DispatcherMessage): Promise<void>;
}

const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;
const DEFAULT_CLOSE_TIMEOUT_MS = 1_000;
const DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024;
/** How much of a refusal's body is read for its reason: the runner's are a short JSON object. */
const MAX_REFUSAL_BODY_BYTES = 4096;

/** What the transport needs from a socket, whichever WebSocket implementation it is. */
interface Socket {
  readonly isOpen: boolean;
  send(text: string): Promise<void>;
  close(code: number, reason: string): void;
  terminate(): void;
}

interface SocketSink {
  text(data: string): void;
  binary(): void;
  error(error: Error): void;
  closed(code: number, reason: string): void;
}

// Minimal view of the `ws` package, so no @types/ws is needed by anyone.
interface NodeWs {
  readonly readyState: number;
  on(event: "open", listener: () => void): void;
  on(event: "message", listener: (data: unknown, isBinary: boolean) => void): void;
  on(event: "error", listener: (error: Error) => void): void;
  on(event: "close", listener: (code: number, reason: Buffer) => void): void;
  on(
    event: "unexpected-response",
    listener: (
      request: unknown,
      response: {
        statusCode?: number;
        headers: Record<string, unknown>;
        on(event: "data", listener: (chunk: Buffer) => void): void;
        on(event: "end", listener: () => void): void;
        on(event: "error", listener: (error: Error) => void): void;
      },
    ) => void,
  ): void;
  send(data: string, callback: (error?: Error) => void): void;
  close(code?: number, reason?: string): void;
  terminate(): void;
}
type NodeWsConstructor = new (url: string, options: Record<string, unknown>) => NodeWs;

let wsModule: Promise<NodeWsConstructor | undefined> | undefined;

function loadWs(): Promise<NodeWsConstructor | undefined> {
  wsModule ??= import("ws").then(
    (module: Record<string, unknown>) =>
      ((module.default ?? module.WebSocket) as NodeWsConstructor | undefined) ?? undefined,
    () => undefined,
  );
  return wsModule;
}

function statusText(status: number): string {
  switch (status) {
    case 401:
      return "401 Unauthorized: missing or wrong token";
    case 403:
      return "403 Forbidden: origin not allowed";
    case 429:
      return "429 Too Many Requests: the token's tenant is at one of its quotas";
    case 503:
      return "503 Service Unavailable: the runner is busy or draining";
    default:
      return String(status);
  }
}

/** The reason a runner gave in a refusal's body (`{"message": ..., "quota": ...}`), where it is one. */
function refusalReason(body: Buffer): { message?: string; quota?: string } {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString("utf8"));
  } catch {
    return {};
  }
  if (parsed === null || typeof parsed !== "object") {
    return {};
  }
  const { message, quota } = parsed as Record<string, unknown>;
  return {
    message: typeof message === "string" && message !== "" ? message.slice(0, 500) : undefined,
    quota: typeof quota === "string" ? quota : undefined,
  };
}

/** One connection attempt: settles once, with the socket or why not, however it ends; an abort stops it. */
class Attempt {
  settled = false;

  constructor(
    private readonly resolve: (socket: Socket) => void,
    private readonly reject: (error: Error) => void,
    private readonly signal: AbortSignal | undefined,
    private readonly stop: () => void,
    private readonly cleanup: () => void = () => {},
  ) {}

  private readonly onAbort = (): void => {
    this.settle(new RunnerConnectionError("Connecting to the runner was aborted"));
    this.stop();
  };

  settle(outcome: Socket | Error): void {
    if (this.settled) {
      return;
    }
    this.settled = true;
    this.cleanup();
    this.signal?.removeEventListener("abort", this.onAbort);
    if (outcome instanceof Error) {
      this.reject(outcome);
    } else {
      this.resolve(outcome);
    }
  }

  /** Start listening for the caller's abort (or act on one that already happened). */
  watchAbort(): void {
    if (this.signal?.aborted) {
      this.onAbort();
    } else {
      this.signal?.addEventListener("abort", this.onAbort, { once: true });
    }
  }
}

function connectWithWs(
  WebSocket: NodeWsConstructor,
  url: string,
  headers: Record<string, string>,
  options: ConnectOptions,
  sink: SocketSink,
): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    let refusal: RunnerConnectionError | undefined;
    let ws: NodeWs;
    try {
      ws = new WebSocket(url, {
        ...options.tls,
        headers,
        handshakeTimeout: options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS,
        maxPayload: options.maxPayload ?? DEFAULT_MAX_PAYLOAD,
        perMessageDeflate: false,
        followRedirects: false,
      });
    } catch (error) {
      // Node's own checks, such as a header value with a newline.
      reject(new RunnerConnectionError(`Could not connect to the runner at ${url}: ${messageOf(error)}`));
      return;
    }
    const attempt = new Attempt(resolve, reject, options.signal, () => ws.terminate());
    const socket: Socket = {
      get isOpen() {
        return ws.readyState === 1;
      },
      send: (text) =>
        new Promise<void>((sent, failed) => {
          if (ws.readyState !== 1) {
            failed(new Error("The connection to the runner is closed"));
            return;
          }
          ws.send(text, (error) => (error ? failed(error) : sent()));
        }),
      close: (code, reason) => ws.close(code, reason),
      terminate: () => ws.terminate(),
    };

    ws.on("unexpected-response", (_request, response) => {
      const status = response.statusCode ?? 0;
      const header = Number(response.headers["retry-after"]);
      const retryAfter = Number.isFinite(header) ? header : undefined;
      const refused = `The runner at ${url} refused the connection: HTTP ${statusText(status)}`;
      // Until the body's reason is read: the handshake's timeout may end the attempt first.
      refusal = new RunnerConnectionError(refused, status, retryAfter);
      const chunks: Buffer[] = [];
      let size = 0;
      const refuse = () => {
        if (attempt.settled) {
          return;
        }
        const reason = refusalReason(Buffer.concat(chunks).subarray(0, MAX_REFUSAL_BODY_BYTES));
        const message = reason.message === undefined ? refused : `${refused} (${reason.message})`;
        refusal = new RunnerConnectionError(message, status, retryAfter, reason.quota);
        ws.terminate();
      };
      response.on("data", (chunk: Buffer) => {
        chunks.push(chunk);
        size += chunk.length;
        if (size >= MAX_REFUSAL_BODY_BYTES) {
          refuse();
        }
      });
      response.on("end", refuse);
      response.on("error", refuse);
    });
    ws.on("open", () => attempt.settle(socket));
    ws.on("message", (data, isBinary) => {
      if (isBinary) {
        sink.binary();
        return;
      }
      const bytes = Array.isArray(data)
        ? Buffer.concat(data as Buffer[])
        : data instanceof ArrayBuffer
          ? Buffer.from(new Uint8Array(data))
          : (data as Buffer);
      sink.text(bytes.toString("utf8"));
    });
    ws.on("error", (error) => {
      if (!attempt.settled) {
        attempt.settle(
          refusal ??
            new RunnerConnectionError(
              `Could not connect to the runner at ${url}: ${error.message}`,
            ),
        );
        return;
      }
      sink.error(error);
    });
    ws.on("close", (code, reason) => {
      if (!attempt.settled) {
        attempt.settle(
          refusal ??
            new RunnerConnectionError(`The runner at ${url} closed the connection (${code})`),
        );
        return;
      }
      sink.closed(code, reason.toString("utf8"));
    });
    attempt.watchAbort();
  });
}

function connectWithPlatform(
  WebSocket: WebSocketConstructorLike,
  url: string,
  headers: Record<string, string>,
  options: ConnectOptions,
  sink: SocketSink,
): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    let ws: WebSocketLike;
    try {
      ws = Object.keys(headers).length > 0 ? new WebSocket(url, { headers }) : new WebSocket(url);
    } catch (error) {
      reject(
        new RunnerConnectionError(
          `Could not connect to the runner at ${url}: ${messageOf(error)}`,
        ),
      );
      return;
    }
    ws.binaryType = "arraybuffer";
    const timer = setTimeout(() => {
      attempt.settle(new RunnerConnectionError(`Connecting to the runner at ${url} timed out`));
      ws.close();
    }, options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS);
    const attempt = new Attempt(resolve, reject, options.signal, () => ws.close(), () => clearTimeout(timer));
    const socket: Socket = {
      get isOpen() {
        return ws.readyState === 1;
      },
      send: async (text) => {
        if (ws.readyState !== 1) {
          throw new Error("The connection to the runner is closed");
        }
        ws.send(text);
      },
      close: (code, reason) => ws.close(code, reason),
      // A WHATWG WebSocket has no way to drop the connection without a closing handshake.
      terminate: () => ws.close(),
    };
    ws.addEventListener("open", () => attempt.settle(socket));
    ws.addEventListener("message", (event: { data: unknown }) => {
      if (typeof event.data === "string") {
        sink.text(event.data);
      } else {
        sink.binary();
      }
    });
    ws.addEventListener("error", (event: { message?: unknown; error?: unknown }) => {
      const detail =
        event.error instanceof Error
          ? event.error.message
          : typeof event.message === "string"
            ? event.message
            : "WebSocket error";
      if (!attempt.settled) {
        attempt.settle(
          new RunnerConnectionError(
            `Could not connect to the runner at ${url}: ${detail} (a refused handshake, such as 401 for a missing or wrong token, looks the same here)`,
          ),
        );
        return;
      }
      sink.error(new Error(detail));
    });
    ws.addEventListener("close", (event: { code?: number; reason?: string }) => {
      if (!attempt.settled) {
        attempt.settle(
          new RunnerConnectionError(
            `The runner at ${url} closed the connection (${event.code ?? "no code"})`,
          ),
        );
        return;
      }
      sink.closed(event.code ?? 1006, event.reason ?? "");
    });
    attempt.watchAbort();
  });
}

function checkUrl(raw: string | URL): string {
  let url: URL;
  try {
    url = new URL(String(raw));
  } catch {
    throw new RunnerConnectionError(`Not a runner URL: ${String(raw)}`);
  }
  if (url.protocol !== "ws:" && url.protocol !== "wss:") {
    throw new RunnerConnectionError(
      `A runner URL starts with ws:// or wss://, not ${url.protocol}//: ${url.href}`,
    );
  }
  return url.href;
}

/**
 * Opens one WebSocket connection to a runner and returns it as an execbox
 * `HostTransport`, for `runHostTransportSession` or {@link runHostSession}.
 *
 * Every frame is one JSON message. A `tool_call` without `input` is delivered with
 * `input: undefined` (so execbox's own session answers it instead of ignoring it);
 * malformed or binary frames are reported through `onError`. Rejects with a
 * {@link RunnerConnectionError} (with `status` for a refused handshake).
 */
export async function connectWebSocketTransport(
  options: ConnectOptions | string | URL,
): Promise<WebSocketHostTransport> {
  const settings: ConnectOptions =
    typeof options === "string" || options instanceof URL ? { url: options } : options;
  const url = checkUrl(settings.url);
  if (settings.signal?.aborted) {
    throw new RunnerConnectionError("Connecting to the runner was aborted");
  }
  const headers: Record<string, string> = { ...settings.headers };
  if (settings.token !== undefined) {
    // As the Python client checks it; the message never shows the token.
    if (typeof settings.token !== "string" || !/^[\x21-\x7e]+$/.test(settings.token)) {
      throw new RunnerConnectionError("The token must be printable ASCII without spaces, and not empty");
    }
    headers.Authorization = `Bearer ${settings.token}`;
  }

  const messageHandlers = new Set<(message: RunnerMessage) => void>();
  const errorHandlers = new Set<(error: Error) => void>();
  const closeHandlers = new Set<(reason?: TransportCloseReason) => void>();
  let closed = false;
  let closing: Promise<void> | undefined;
  let onClosed: (() => void) | undefined;
  const closedPromise = new Promise<void>((resolve) => {
    onClosed = resolve;
  });

  const reportError = (error: Error): void => {
    for (const handler of [...errorHandlers]) {
      handler(error);
    }
  };
  const sink: SocketSink = {
    text(data) {
      let value: unknown;
      try {
        value = JSON.parse(data);
      } catch {
        reportError(new Error("The runner sent a frame that is not JSON"));
        return;
      }
      const message = checkRunnerMessage(value);
      if (typeof message === "string") {
        reportError(new Error(`The runner sent an invalid message: ${message}`));
        return;
      }
      if (message === undefined) {
        return;
      }
      for (const handler of [...messageHandlers]) {
        // A `log` reaches hosts that asked for live logs; execbox's own hosts ignore types they do not know.
        handler(message as RunnerMessage);
      }
    },
    binary() {
      reportError(new Error("The runner sent a binary frame"));
    },
    error: reportError,
    closed(code, reason) {
      closed = true;
      onClosed?.();
      const message = `The runner connection closed (${code}${reason ? `: ${reason}` : ""})`;
      for (const handler of [...closeHandlers]) {
        handler({ code, message });
      }
    },
  };

  const NodeWebSocket = settings.WebSocket ? undefined : await loadWs();
  let socket: Socket;
  if (NodeWebSocket) {
    socket = await connectWithWs(NodeWebSocket, url, headers, settings, sink);
  } else {
    const Platform =
      settings.WebSocket ??
      (globalThis as { WebSocket?: WebSocketConstructorLike }).WebSocket;
    if (!Platform) {
      throw new RunnerConnectionError(
        "No WebSocket implementation: install the `ws` package or pass options.WebSocket",
      );
    }
    socket = await connectWithPlatform(Platform, url, headers, settings, sink);
  }
  const closeTimeoutMs = settings.closeTimeoutMs ?? DEFAULT_CLOSE_TIMEOUT_MS;

  return {
    url,
    get closed() {
      return closed;
    },
    send(message) {
      if (closed || !socket.isOpen) {
        return Promise.reject(new Error("The connection to the runner is closed"));
      }
      return socket.send(JSON.stringify(message));
    },
    onMessage(handler) {
      messageHandlers.add(handler);
      return () => {
        messageHandlers.delete(handler);
      };
    },
    onError(handler) {
      errorHandlers.add(handler);
      return () => {
        errorHandlers.delete(handler);
      };
    },
    onClose(handler) {
      closeHandlers.add(handler);
      return () => {
        closeHandlers.delete(handler);
      };
    },
    dispose() {
      if (closed) {
        return Promise.resolve();
      }
      closing ??= new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          socket.terminate();
          resolve();
        }, closeTimeoutMs);
        void closedPromise.then(() => {
          clearTimeout(timer);
          resolve();
        });
        socket.close(1000, "");
      });
      return closing;
    },
    terminate() {
      socket.terminate();
    },
  };
}
