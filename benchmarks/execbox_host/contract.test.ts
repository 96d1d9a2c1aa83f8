import { runExecutorContractSuite } from "../packages/core/test-support/runExecutorContractSuite";
import { RemoteExecutor } from "../packages/remote/src/index";
import { connectWsTransport } from "./wsTransport";

const url = process.env.RUNNER_URL ?? "ws://127.0.0.1:18900/";
const addMissingInput = process.env.ADD_MISSING_INPUT === "1";

runExecutorContractSuite(`RemoteExecutor over WebSocket (${url})`, (options) =>
  new RemoteExecutor({ ...options, connectTransport: () => connectWsTransport({ url, addMissingInput }) }),
);
