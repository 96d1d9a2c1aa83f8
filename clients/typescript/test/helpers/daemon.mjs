// Starts a real execbox-runner daemon for the tests and stops it by its PID.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const repo = resolve(here, "../../../..");

/** The Python that runs the daemon: $EXECBOX_RUNNER_PYTHON, else the repository's .venv. */
export const python =
  process.env.EXECBOX_RUNNER_PYTHON ?? resolve(repo, ".venv/bin/python");

/**
 * Starts `python -m execbox_runner serve --host 127.0.0.1 --port 0 ...args` and
 * resolves once it prints its URL (bounded by `startTimeoutMs`).
 */
export async function startDaemon(args = [], { startTimeoutMs = 30_000 } = {}) {
  const child = spawn(
    python,
    ["-m", "execbox_runner", "serve", "--host", "127.0.0.1", "--port", "0", ...args],
    { cwd: repo, stdio: ["ignore", "pipe", "pipe"] },
  );
  let stderr = "";
  child.stderr.setEncoding("utf8");
  child.stderr.on("data", (chunk) => {
    stderr = (stderr + chunk).slice(-4000);
  });
  child.stdout.setEncoding("utf8");
  let stdout = "";
  const url = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`daemon did not start within ${startTimeoutMs} ms:\n${stderr}`));
    }, startTimeoutMs);
    child.stdout.on("data", (chunk) => {
      stdout += chunk;
      const match = /listening on (wss?:\/\/127\.0\.0\.1:\d+\/)/.exec(stdout);
      if (match) {
        clearTimeout(timer);
        resolveUrl(match[1]);
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`daemon exited (${code}) before listening:\n${stderr}`));
    });
    child.once("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
  }).catch((error) => {
    if (child.exitCode === null) {
      process.kill(child.pid, "SIGKILL");
    }
    throw error;
  });

  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) {
      return;
    }
    const exited = once(child, "exit");
    process.kill(child.pid, "SIGTERM");
    const killer = setTimeout(() => {
      if (child.exitCode === null && child.signalCode === null) {
        process.kill(child.pid, "SIGKILL");
      }
    }, 10_000);
    await exited;
    clearTimeout(killer);
  };
  return { url, pid: child.pid, stop, stderr: () => stderr };
}
