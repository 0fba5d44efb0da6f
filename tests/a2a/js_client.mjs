// The official JS A2A SDK (`@a2a-js/sdk` 1.x) as a client of a real `warden serve` (tests/a2a.rs runs
// it). Usage: node js_client.mjs SDK_DIR BASE_URL ADMIN_TOKEN — prints `PASS name` per check and
// throws (non-zero exit) on the first failure. The team is docs/a2a.md's.
import { pathToFileURL } from "node:url";
import path from "node:path";
import { randomUUID } from "node:crypto";

const [sdkDir, base, token] = process.argv.slice(2);
const load = (file) => import(pathToFileURL(path.join(sdkDir, "dist", file)).href);
const { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory } = await load("client/index.js");
const { TaskState } = await load("index.js");

const authed = (input, init = {}) => {
  const headers = new Headers(init.headers ?? {});
  headers.set("Authorization", `Bearer ${token}`);
  return fetch(input, { ...init, headers });
};
const factory = new ClientFactory(
  ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl: authed })],
  }),
);
const client = await factory.createFromUrl(base);
const check = (ok, what, value) => {
  if (!ok) throw new Error(`${what}: ${JSON.stringify(value)}`);
};
const message = (text, agent, taskId) => ({
  message: {
    messageId: randomUUID(),
    role: 1, // ROLE_USER
    parts: [{ content: { $case: "text", value: text } }],
    metadata: agent ? { agent } : undefined,
    taskId: taskId ?? "",
    contextId: "",
    extensions: [],
    referenceTaskIds: [],
  },
});

// `sendMessage` resolves to the task itself (`SendMessageResult` = Task | Message).
const taskOf = (response) => {
  check(typeof response?.id === "string" && response.status, "a task", response);
  return response;
};
const sent = await client.sendMessage(message("hi", "a"));
const task = taskOf(sent);
check(task.status?.state === TaskState.TASK_STATE_COMPLETED, "send completes", sent);
console.log("PASS send");

const got = await client.getTask({ id: task.id, tenant: "", historyLength: undefined });
check(got.id === task.id && got.status.state === TaskState.TASK_STATE_COMPLETED, "get", got);
console.log("PASS get");

const items = [];
for await (const item of client.sendMessageStream(message("stream it", "a"))) items.push(item);
const last = items[items.length - 1];
check(last?.payload?.$case === "statusUpdate", "the stream ends with a status update", items);
const lastStatus = last.payload.value.status;
check(lastStatus?.state === TaskState.TASK_STATE_COMPLETED, "stream ends completed", items);
console.log("PASS stream");

const asked = await client.sendMessage(message("look it up", "asker"));
const askedTask = taskOf(asked);
check(askedTask.status.state === TaskState.TASK_STATE_INPUT_REQUIRED, "input-required", asked);
const answered = await client.sendMessage(message("yes", undefined, askedTask.id));
const answeredTask = taskOf(answered);
check(answeredTask.status.state === TaskState.TASK_STATE_COMPLETED, "answered", answered);
console.log("PASS input_required");

let notFound = false;
try {
  await client.getTask({ id: "a/999999", tenant: "" });
} catch (e) {
  notFound = /-32001|not found|no task/i.test(`${e?.code ?? ""} ${e?.message ?? e}`);
}
check(notFound, "unknown task refused", null);
console.log("PASS errors");
