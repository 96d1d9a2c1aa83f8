// A scripted runner on 127.0.0.1 for behaviours a real daemon never shows (it never
// answers, it answers wrongly, it refuses), recording what the host sends and when.
import { createServer } from "node:net";
import { once } from "node:events";

import { WebSocketServer } from "ws";

/**
 * Starts a WebSocket server whose `onMessage(message, socket, connection)` decides
 * what to answer. `verifyClient` is passed to ws (to refuse handshakes).
 * Every connection records `{ at, message }` for each frame and `closedAt`.
 */
export async function startFakeRunner({ onMessage = () => {}, verifyClient } = {}) {
  const server = new WebSocketServer({
    host: "127.0.0.1",
    port: 0,
    perMessageDeflate: false,
    ...(verifyClient ? { verifyClient } : {}),
  });
  await once(server, "listening");
  const connections = [];
  server.on("connection", (socket, request) => {
    const connection = {
      headers: request.headers,
      frames: [],
      closedAt: undefined,
      closeCode: undefined,
    };
    connections.push(connection);
    socket.on("message", (data) => {
      const message = JSON.parse(data.toString("utf8"));
      connection.frames.push({ at: Date.now(), raw: data.toString("utf8"), message });
      onMessage(message, socket, connection);
    });
    socket.on("close", (code) => {
      connection.closedAt = Date.now();
      connection.closeCode = code;
    });
  });
  const { port } = server.address();
  return {
    url: `ws://127.0.0.1:${port}/`,
    connections,
    async stop() {
      for (const client of server.clients) {
        client.terminate();
      }
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/** A TCP server on 127.0.0.1 that accepts connections and never says anything. */
export async function startSilentTcpServer() {
  const sockets = new Set();
  const server = createServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => {});
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `ws://127.0.0.1:${server.address().port}/`,
    async stop() {
      for (const socket of sockets) {
        socket.destroy();
      }
      await new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/** Resolves when `predicate()` holds, polling; rejects after `timeoutMs` (a bound, not a measurement). */
export async function waitFor(predicate, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) {
      throw new Error("condition not met in time");
    }
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/**
 * A runner that answers `execute` with `started`, and with an ok `done` (result "late") only
 * `lateMs` later: an event far past the host's own deadline. A result that is not "late" shows
 * the host ended the execution first, whatever the machine's load.
 */
export async function startLateRunner(lateMs = 5_000) {
  const timers = [];
  const runner = await startFakeRunner({
    onMessage: (message, socket) => {
      if (message.type === "execute") {
        socket.send(JSON.stringify({ type: "started", id: message.id }));
        const late = { type: "done", id: message.id, ok: true, durationMs: lateMs, logs: [], result: "late" };
        timers.push(setTimeout(() => socket.send(JSON.stringify(late)), lateMs));
      }
    },
  });
  const stop = runner.stop;
  runner.stop = async () => {
    timers.forEach(clearTimeout);
    await stop();
  };
  return runner;
}

/**
 * A runner that answers every `execute` at once, with `started` and an ok `done` (result 1)
 * holding `logs`, as a runner without live logs does.
 */
export function startAnsweringRunner({ logs = [] } = {}) {
  return startFakeRunner({
    onMessage: (message, socket) => {
      if (message.type === "execute") {
        socket.send(JSON.stringify({ type: "started", id: message.id }));
        socket.send(JSON.stringify({ type: "done", id: message.id, ok: true, durationMs: 1, logs, result: 1 }));
      }
    },
  });
}
