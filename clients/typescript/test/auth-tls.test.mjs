// Token authentication and wss:// against a real daemon.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  connectWebSocketTransport,
  defineProvider,
  RunnerConnectionError,
  RunnerExecutor,
} from "../dist/index.js";
import { startDaemon } from "./helpers/daemon.mjs";

const TOKEN = "test-token-0123456789";

describe("token authentication", () => {
  let daemon;
  before(async () => {
    daemon = await startDaemon(["--tokens", `${TOKEN},another-token`]);
  });
  after(async () => {
    await daemon?.stop();
  });

  test("the right token runs code", async () => {
    const executor = new RunnerExecutor({ url: daemon.url, token: TOKEN });
    const provider = defineProvider({ name: "t", tools: { id: (x) => x } });
    const result = await executor.execute("await t.id({v: 7})", [provider]);
    assert.deepEqual(result.result, { v: 7 });
    await executor.dispose();
  });

  for (const [label, token] of [
    ["no token", undefined],
    ["a wrong token", "wrong"],
  ]) {
    test(`${label}: 401, as a RunnerConnectionError and as an internal_error result`, async () => {
      await assert.rejects(connectWebSocketTransport({ url: daemon.url, token }), (error) => {
        assert.ok(error instanceof RunnerConnectionError);
        assert.equal(error.status, 401);
        assert.match(error.message, /401 Unauthorized: missing or wrong token/);
        return true;
      });
      const executor = new RunnerExecutor({ url: daemon.url, token });
      const result = await executor.execute("1", []);
      assert.equal(result.ok, false);
      assert.equal(result.error.code, "internal_error");
      assert.match(result.error.message, /HTTP 401/);
      await executor.dispose();
    });
  }

  test("a token or header that cannot be sent is a RunnerConnectionError saying so, without the token", async () => {
    for (const token of ["", "has space", `${TOKEN}\n`, "tök"]) {
      await assert.rejects(connectWebSocketTransport({ url: daemon.url, token }), (error) => {
        assert.ok(error instanceof RunnerConnectionError);
        assert.equal(error.message, "The token must be printable ASCII without spaces, and not empty");
        return true;
      });
    }
    await assert.rejects(
      connectWebSocketTransport({ url: daemon.url, headers: { "X-Note": "two\nlines" } }),
      (error) => error instanceof RunnerConnectionError && /X-Note/.test(error.message),
    );
    const result = await new RunnerExecutor({ url: daemon.url, token: `${TOKEN}\n` }).execute("1", []);
    assert.deepEqual(result.error, {
      code: "internal_error",
      message: "The token must be printable ASCII without spaces, and not empty",
    });
  });

  test("extra headers go with the handshake", async () => {
    const executor = new RunnerExecutor({
      url: daemon.url,
      headers: { Authorization: `Bearer ${TOKEN}`, "X-Request-Id": "abc" },
    });
    const result = await executor.execute("'ok'", []);
    assert.equal(result.result, "ok");
    await executor.dispose();
  });
});

describe("wss://", () => {
  let daemon;
  let directory;
  let cert;
  let skip = false;

  before(async () => {
    directory = mkdtempSync(join(tmpdir(), "execbox-client-tls-"));
    try {
      execFileSync(
        "openssl",
        [
          "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
          "-keyout", join(directory, "key.pem"), "-out", join(directory, "cert.pem"),
          "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
        ],
        { stdio: "ignore", timeout: 30_000 },
      );
    } catch {
      skip = true;
      return;
    }
    cert = readFileSync(join(directory, "cert.pem"));
    daemon = await startDaemon([
      "--certfile", join(directory, "cert.pem"),
      "--keyfile", join(directory, "key.pem"),
      "--tokens", TOKEN,
    ]);
  });
  after(async () => {
    await daemon?.stop();
    rmSync(directory, { recursive: true, force: true });
  });

  test("the daemon's certificate as ca: tools over wss://", async (t) => {
    if (skip) {
      t.skip("no openssl to make a certificate");
      return;
    }
    assert.match(daemon.url, /^wss:\/\//);
    const executor = new RunnerExecutor({ url: daemon.url, token: TOKEN, tls: { ca: cert } });
    const provider = defineProvider({ name: "t", tools: { hello: () => "over TLS" } });
    const result = await executor.execute("await t.hello()", [provider]);
    assert.equal(result.result, "over TLS");
    await executor.dispose();
  });

  test("an untrusted certificate is refused by default", async (t) => {
    if (skip) {
      t.skip("no openssl to make a certificate");
      return;
    }
    const executor = new RunnerExecutor({ url: daemon.url, token: TOKEN });
    const result = await executor.execute("1", []);
    assert.equal(result.error.code, "internal_error");
    assert.match(result.error.message, /certificate/i);
    await executor.dispose();
  });
});
