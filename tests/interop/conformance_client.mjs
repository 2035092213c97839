// The client under test in the official client conformance scenarios
// (@modelcontextprotocol/conformance), built on the official TypeScript SDK
// client.
//
//     conformance client --scenario NAME --command "node conformance_client.mjs"
//
// The conformance tool starts a test server for the scenario, then runs this
// script with the server's URL as the last argument and the scenario's name
// in MCP_CONFORMANCE_SCENARIO. With INTEROP_PROXY set (a command line: the
// tap and mcp-retry), the script is a stdio client (StdioClientTransport)
// launching that command followed by `run --url URL`; without it, it
// connects to the URL itself (StreamableHTTPClientTransport), the direct run
// run.py compares with. It does what the scenario asks of a client and
// writes {"steps": [{name, value, ok}...]} to INTEROP_OUT; the conformance
// tool judges the server's side.
import { writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ElicitRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const url = process.argv.at(-1);
const scenario = process.env.MCP_CONFORMANCE_SCENARIO;
const out = process.env.INTEROP_OUT;
if (!url || !scenario || !out) {
  console.error("usage: MCP_CONFORMANCE_SCENARIO=NAME INTEROP_OUT=FILE [INTEROP_PROXY=JSON] conformance_client.mjs URL");
  process.exit(2);
}

const steps = [];
const plain = (value) => (value === undefined ? null : JSON.parse(JSON.stringify(value)));
const record = (name, value, ok = true) => steps.push({ name, value: plain(value), ok });

// SEP-1034: a client that declares `applyDefaults` fills the fields the user
// left out with the defaults of the requested schema (the SDK does it).
const client = new Client(
  { name: "mcp-retry-interop-conformance", version: "1.0.0" },
  { capabilities: { elicitation: { form: { applyDefaults: true } } } },
);
client.setRequestHandler(ElicitRequestSchema, async (request) => {
  record("elicitation/create as the client received it", request.params);
  return { action: "accept", content: {} };
});

// Lists the tools and calls each with the arguments the scenario expects.
const ARGUMENTS = { add_numbers: { a: 5, b: 3 } };
async function listAndCall() {
  const { tools } = await client.listTools();
  record("tools/list", { tools });
  for (const tool of tools) {
    const result = await client.callTool({ name: tool.name, arguments: ARGUMENTS[tool.name] ?? {} });
    record(`tools/call ${tool.name}`, result, !result.isError);
  }
}

const scenarios = {
  initialize: async () => record("tools/list", await client.listTools()),
  tools_call: listAndCall,
  "elicitation-sep1034-client-defaults": listAndCall,
  // The server closes the call's stream after a priming event carrying
  // `retry: 500`; the answer comes on the GET that resumes it. The call is
  // the first request after `initialized`, so the server's own GET stream
  // must already be open when it goes out: a GET opened later would take
  // the answer before the resumption and look like a reconnection that did
  // not wait.
  "sse-retry": async () => {
    const result = await client.callTool({ name: "test_reconnection", arguments: {} });
    record("tools/call test_reconnection", result, !result.isError);
    record("tools/list", await client.listTools());
  },
};
if (!(scenario in scenarios)) {
  console.error(`conformance_client.mjs: no client for scenario ${scenario}`);
  process.exit(2);
}

let transport;
if (process.env.INTEROP_PROXY) {
  const [command, ...args] = JSON.parse(process.env.INTEROP_PROXY);
  transport = new StdioClientTransport({
    command,
    args: [...args, "run", "--url", url],
    env: { ...process.env },
    stderr: "inherit",
  });
} else {
  transport = new StreamableHTTPClientTransport(new URL(url));
}
await client.connect(transport);
record("handshake", { serverVersion: client.getServerVersion(), capabilities: client.getServerCapabilities() });
await scenarios[scenario]();
await client.close();
writeFileSync(out, JSON.stringify({ steps }, null, 1));
