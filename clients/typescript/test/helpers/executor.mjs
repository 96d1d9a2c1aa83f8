// One daemon and one executor shared by a test file's tests: started before them, disposed and
// stopped after them (node:test's before and after hooks, registered by the call).
import { after, before } from "node:test";

import { RunnerExecutor } from "../../dist/index.js";
import { startDaemon } from "./daemon.mjs";

/** `{ daemon, executor }`, filled in once the file's `before` hook has run. */
export function sharedExecutor() {
  const shared = { daemon: undefined, executor: undefined };
  before(async () => {
    shared.daemon = await startDaemon();
    shared.executor = new RunnerExecutor({ url: shared.daemon.url });
  });
  after(async () => {
    await shared.executor?.dispose();
    await shared.daemon?.stop();
  });
  return shared;
}
