// A minimal WebSocket HostTransport for execbox's RemoteExecutor (the execbox_host harness).
import WebSocket from "ws";
import type {
  DispatcherMessage,
  HostTransport,
  RunnerMessage,
  TransportCloseReason,
} from "@execbox/core/protocol";

export interface WsTransportOptions {
  url: string;
  // When true, a tool_call frame without "input" gets input: undefined, as the
  // spec's JSON transport note allows ("omitted tool input may be represented by
  // a missing input field"); execbox's isRunnerMessage requires the key.
  addMissingInput?: boolean;
  connectTimeoutMs?: number;
}

export function connectWsTransport(opts: WsTransportOptions): Promise<HostTransport> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(opts.url, { perMessageDeflate: false });
    const closeHandlers = new Set<(r?: TransportCloseReason) => void>();
    const errorHandlers = new Set<(e: Error) => void>();
    const messageHandlers = new Set<(m: RunnerMessage) => void>();
    let opened = false;
    let closed = false;
    const timer = setTimeout(() => {
      if (!opened) { ws.terminate(); reject(new Error("connect timeout")); }
    }, opts.connectTimeoutMs ?? 10_000);

    const emitClose = (reason: TransportCloseReason) => {
      if (closed) return;
      closed = true;
      for (const h of [...closeHandlers]) h(reason);
    };

    ws.on("unexpected-response", (_req, res) => {
      clearTimeout(timer);
      reject(new Error(`handshake refused: HTTP ${res.statusCode}`));
      ws.terminate();
    });
    ws.on("open", () => {
      opened = true;
      clearTimeout(timer);
      resolve(transport);
    });
    ws.on("error", (err) => {
      if (!opened) { clearTimeout(timer); reject(err); return; }
      for (const h of [...errorHandlers]) h(err);
    });
    ws.on("close", (code, reason) => {
      if (!opened) return;
      emitClose({ code, message: `WebSocket closed (${code}${reason.length ? " " + reason.toString() : ""})` });
    });
    ws.on("message", (data, isBinary) => {
      const raw = isBinary ? null : data.toString();
      if (raw === null) return;
      let msg: any;
      try { msg = JSON.parse(raw); } catch { return; }
      if (opts.addMissingInput && msg && msg.type === "tool_call" && !("input" in msg)) {
        msg.input = undefined;
      }
      for (const h of [...messageHandlers]) h(msg as RunnerMessage);
    });

    const transport: HostTransport = {
      dispose() {
        if (ws.readyState === WebSocket.OPEN || ws.readyState === WebSocket.CONNECTING) ws.close(1000);
      },
      onClose(h) { closeHandlers.add(h); return () => closeHandlers.delete(h); },
      onError(h) { errorHandlers.add(h); return () => errorHandlers.delete(h); },
      onMessage(h) { messageHandlers.add(h); return () => messageHandlers.delete(h); },
      send(message: DispatcherMessage) {
        if (ws.readyState !== WebSocket.OPEN) throw new Error("Remote transport closed");
        const raw = JSON.stringify(message);
        return new Promise<void>((res, rej) => ws.send(raw, (err) => (err ? rej(err) : res())));
      },
      terminate() {
        ws.terminate();
        emitClose({ message: "Remote transport terminated" });
      },
    };
  });
}
