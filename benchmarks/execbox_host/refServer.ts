// The reference runner: execbox's QuickJS remote endpoint behind a ws server (see execbox_host.py).
import { WebSocketServer } from "ws";
import { attachQuickJsRemoteEndpoint } from "@execbox/quickjs/remote-endpoint";

const port = Number(process.env.PORT ?? 18901);
const wss = new WebSocketServer({ host: "127.0.0.1", port, perMessageDeflate: false, backlog: 4096 });
wss.on("connection", (ws) => {
  attachQuickJsRemoteEndpoint({
    onMessage(handler) {
      const fn = (data: Buffer, isBinary: boolean) => {
        if (isBinary) return;
        let msg: unknown;
        try { msg = JSON.parse(data.toString()); } catch { return; }
        handler(msg);
      };
      ws.on("message", fn);
      return () => ws.off("message", fn);
    },
    onClose(handler) { const fn = () => handler({ message: "closed" }); ws.on("close", fn); return () => ws.off("close", fn); },
    onError(handler) { const fn = (e: Error) => handler(e); ws.on("error", fn); return () => ws.off("error", fn); },
    send(message) {
      if (ws.readyState !== ws.OPEN) return;
      return new Promise<void>((res, rej) => ws.send(JSON.stringify(message), (e) => (e ? rej(e) : res())));
    },
  });
});
wss.on("listening", () => console.log(`reference runner listening on ws://127.0.0.1:${port}/ pid ${process.pid}`));
process.on("SIGTERM", () => { wss.close(); process.exit(0); });
