// The interop scenarios, driven by the official TypeScript SDK client
// (@modelcontextprotocol/sdk: Client + StdioClientTransport).
//
//     node ts_client.mjs SCENARIO OUT_JSON -- COMMAND [ARGS...]
//
// The second client of the suite, in the shape of py_client.py: it launches
// COMMAND (the server, or `mcp-retry run -- server`), runs SCENARIO and writes
// {"steps": [{name, value, ok}...], "cancelled": [...]} to OUT_JSON for
// run.py to compare. The 1.x SDK speaks only the initialize era.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import {
  CreateMessageRequestSchema,
  ElicitRequestSchema,
  ListRootsRequestSchema,
  LoggingMessageNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const [scenario, out, sep, ...command] = process.argv.slice(2);
if (sep !== "--" || command.length === 0) {
  console.error("usage: ts_client.mjs SCENARIO OUT_JSON -- COMMAND [ARGS...]");
  process.exit(2);
}

const steps = [];
const cancelled = [];
const samplingRequests = [];
const elicitationRequests = [];
const logMessages = [];
const notifications = [];
let rootsRequests = 0;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
// A JSON round trip: what the SDK parsed, as plain wire JSON.
const plain = (value) => (value === undefined ? null : JSON.parse(JSON.stringify(value)));

function record(name, value, ok = true) {
  steps.push({ name, value: plain(value), ok });
}

// Runs one request; records its result, or the JSON-RPC error it got.
// `expect` is what the direct run must see: "result", "error" or "any".
async function step(name, fn, expect = "result") {
  try {
    const result = await fn();
    record(name, result, expect !== "error");
    return result;
  } catch (e) {
    if (e instanceof McpError) {
      record(name, { error: { code: e.code, message: e.message, data: e.data ?? null } }, expect !== "result");
    } else {
      record(name, { exception: String(e) }, false);
    }
    return undefined;
  }
}

const client = new Client(
  { name: "mcp-retry-interop-ts", version: "1.0.0" },
  { capabilities: { sampling: {}, elicitation: {}, ...(scenario === "everything" ? { roots: { listChanged: true } } : {}) } },
);
client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
  samplingRequests.push(request.params);
  const last = request.params.messages.at(-1);
  // Numbered, as a model's answers differ from one request to the next.
  return {
    role: "assistant",
    content: { type: "text", text: `sampled reply #${samplingRequests.length} to: ${last?.content?.text ?? ""}` },
    model: "interop-model",
    stopReason: "endTurn",
  };
});
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  elicitationRequests.push(request.params);
  return { action: "accept", content: { name: "Ada Lovelace", check: true, integer: 7, number: 2.5 } };
});
if (scenario === "everything") {
  client.setRequestHandler(ListRootsRequestSchema, async () => {
    rootsRequests += 1;
    return { roots: [{ uri: "file:///interop/workspace", name: "interop workspace" }] };
  });
}
client.setNotificationHandler(LoggingMessageNotificationSchema, async (n) => {
  logMessages.push(n.params);
});
client.fallbackNotificationHandler = async (n) => {
  notifications.push(n);
};

// The progress values before the last. SDK 1.x runs notification handlers a
// microtask late but settles a request at once, so the last progress (sent
// right before the result) is dropped when both lines arrive in one read;
// whether they do is timing. The wire checks still compare every
// notification, the last included.
const intermediate = (progress) => progress.filter((p) => p.total === undefined || p.progress < p.total);

// Starts a long call, aborts it after its first progress notification
// (the SDK then sends notifications/cancelled), and records what the client
// saw. run.py checks on the wire that the server got the cancellation.
async function cancelLongCall(tool, args, name) {
  const controller = new AbortController();
  let progressSeen = false;
  let firstProgress;
  const gotProgress = new Promise((resolve) => (firstProgress = resolve));
  const started = Date.now();
  const call = client
    .callTool({ name: tool, arguments: args }, undefined, {
      signal: controller.signal,
      onprogress: () => {
        progressSeen = true;
        firstProgress();
      },
    })
    .then(
      () => ({ answered: true }),
      (e) => ({ answered: false, error: e instanceof McpError ? "McpError" : e.name }),
    );
  await Promise.race([gotProgress, sleep(10000)]);
  controller.abort("interop: cancelled on purpose");
  const outcome = await call;
  outcome.progress_seen_before_cancel = progressSeen;
  outcome.cancelled_promptly = Date.now() - started < 5000;
  record(name, outcome, !outcome.answered && progressSeen);
  cancelled.push({ tool, arguments: args });
}

async function everything() {
  // The server asks for the roots 350 ms after `initialized` and then logs
  // "Roots updated": wait for both first, so the wire traffic has the same
  // order in both runs.
  for (let waited = 0; (rootsRequests < 1 || logMessages.length === 0) && waited < 10000; waited += 20) {
    await sleep(20);
  }
  await step("ping", () => client.ping());
  await step("tools/list", () => client.listTools());
  await step("tools/call echo", () => client.callTool({ name: "echo", arguments: { message: "hello, interop" } }));
  await step("tools/call get-sum", () => client.callTool({ name: "get-sum", arguments: { a: 0.1, b: 0.2 } }));
  const progress = [];
  await step("tools/call trigger-long-running-operation (progress)", () =>
    client.callTool({ name: "trigger-long-running-operation", arguments: { duration: 0.6, steps: 3 } }, undefined, {
      onprogress: (p) => progress.push(p),
    }),
  );
  record("progress notifications of the long-running operation", intermediate(progress), intermediate(progress).length === 2);
  await step("tools/call trigger-sampling-request", () =>
    client.callTool({ name: "trigger-sampling-request", arguments: { prompt: "What is 2+2?", maxTokens: 20 } }),
  );
  record("sampling/createMessage as the client received it", samplingRequests, samplingRequests.length === 1);
  await step("tools/call trigger-elicitation-request", () =>
    client.callTool({ name: "trigger-elicitation-request", arguments: {} }),
  );
  record("elicitation/create as the client received it", elicitationRequests, elicitationRequests.length === 1);
  await step("tools/call get-roots-list", () => client.callTool({ name: "get-roots-list", arguments: {} }));
  record("roots/list requests answered", rootsRequests, rootsRequests >= 1);
  await step("tools/call get-structured-content", () =>
    client.callTool({ name: "get-structured-content", arguments: { location: "Los Angeles" } }),
  );
  await step("resources/list", () => client.listResources());
  await step("resources/templates/list", () => client.listResourceTemplates());
  await step("resources/read static document", () =>
    client.readResource({ uri: "demo://resource/static/document/architecture.md" }),
  );
  await step("resources/read dynamic text", () => client.readResource({ uri: "demo://resource/dynamic/text/5" }));
  await step("prompts/list", () => client.listPrompts());
  await step("prompts/get args-prompt", () => client.getPrompt({ name: "args-prompt", arguments: { city: "Porto" } }));
  await step("completion/complete", () =>
    client.complete({ ref: { type: "ref/prompt", name: "completable-prompt" }, argument: { name: "department", value: "S" } }),
  );
  await cancelLongCall("trigger-long-running-operation", { duration: 1.0, steps: 5 }, "cancellation of a long call");
  await step("tools/call echo after the cancellation", () =>
    client.callTool({ name: "echo", arguments: { message: "still here" } }),
  );
  await sleep(1200); // let the cancelled operation run out on the server
  await step("ping at the end", () => client.ping());
  record("logging notifications received", logMessages);
}

async function filesystem() {
  const root = process.env.INTEROP_ROOT;
  const path = join(root, "todo.txt");
  await step("tools/list", () => client.listTools());
  await step("tools/call write_file", () =>
    client.callTool({ name: "write_file", arguments: { path, content: "v1\n" } }),
  );
  await step("tools/call read_text_file", () => client.callTool({ name: "read_text_file", arguments: { path } }));
  await step("tools/call list_directory", () => client.callTool({ name: "list_directory", arguments: { path: root } }));
  await step("tools/call write_file (overwrite)", () =>
    client.callTool({ name: "write_file", arguments: { path, content: "v2\n" } }),
  );
  await step("tools/call write_file (restore v1, same call as before)", () =>
    client.callTool({ name: "write_file", arguments: { path, content: "v1\n" } }),
  );
  await step("tools/call read_text_file after the restore", () =>
    client.callTool({ name: "read_text_file", arguments: { path } }),
  );
  record("file content on disk at the end", readFileSync(path, "utf-8"));
}

async function memory() {
  const carol = { name: "Carol", entityType: "person", observations: ["maintains the proxy"] };
  await step("tools/list", () => client.listTools());
  await step("tools/call create_entities", () =>
    client.callTool({ name: "create_entities", arguments: { entities: [carol] } }),
  );
  await step("tools/call read_graph", () => client.callTool({ name: "read_graph", arguments: {} }));
  await step("tools/call search_nodes", () =>
    client.callTool({ name: "search_nodes", arguments: { query: "proxy" } }),
  );
  await step("tools/call delete_entities", () =>
    client.callTool({ name: "delete_entities", arguments: { entityNames: ["Carol"] } }),
  );
  await step("tools/call create_entities (re-create, same call as before)", () =>
    client.callTool({ name: "create_entities", arguments: { entities: [carol] } }),
  );
  await step("tools/call read_graph at the end", () => client.callTool({ name: "read_graph", arguments: {} }));
  record("memory file on disk at the end", readFileSync(process.env.MEMORY_FILE_PATH, "utf-8"));
}

async function pythonServer() {
  await step("ping", () => client.ping());
  await step("tools/list", () => client.listTools());
  await step("tools/call echo", () => client.callTool({ name: "echo", arguments: { message: "hello, interop" } }));
  await step("tools/call add", () => client.callTool({ name: "add", arguments: { a: 40, b: 2 } }));
  const progress = [];
  await step("tools/call count (progress)", () =>
    client.callTool({ name: "count", arguments: { steps: 3, delay: 0.1 } }, undefined, {
      onprogress: (p) => progress.push(p),
    }),
  );
  record("progress notifications of count", intermediate(progress), intermediate(progress).length === 2);
  await step("tools/call haiku (sampling)", () => client.callTool({ name: "haiku", arguments: { topic: "relays" } }));
  record("sampling requests the client answered", samplingRequests, samplingRequests.length === 1);
  await step("resources/list", () => client.listResources());
  await step("resources/read (template)", () => client.readResource({ uri: "interop://numbers/11" }));
  await step("prompts/get", () => client.getPrompt({ name: "review", arguments: { code: "let x = 1;" } }));
  await cancelLongCall("count", { steps: 10, delay: 0.1 }, "cancellation of a long call");
  await step("tools/call echo after the cancellation", () =>
    client.callTool({ name: "echo", arguments: { message: "still here" } }),
  );
  await sleep(1200);
  await step("ping at the end", () => client.ping());
}

const scenarios = { everything, filesystem, memory, "python-server": pythonServer };

const transport = new StdioClientTransport({
  command: command[0],
  args: command.slice(1),
  env: { ...process.env },
  stderr: "inherit",
});
await client.connect(transport);
record("handshake", {
  serverVersion: client.getServerVersion(),
  capabilities: client.getServerCapabilities(),
  instructions: client.getInstructions() ?? null,
});
await scenarios[scenario]();
record("notifications received", notifications);
await client.close();
writeFileSync(out, JSON.stringify({ steps, cancelled }, null, 1));
