// The official TypeScript MCP SDK as a client of warden's `/mcp` (tests/mcp_server.rs runs it).
// Usage: node client.mjs SDK_DIR URL TOKEN — prints one JSON line: the tools listed, the answer of
// ask_agent, and the result of calling halt.
import { pathToFileURL } from "node:url";
import path from "node:path";

const [sdkDir, url, token] = process.argv.slice(2);
const load = (file) => import(pathToFileURL(path.join(sdkDir, "dist/esm/client", file)).href);
const { Client } = await load("index.js");
const { StreamableHTTPClientTransport } = await load("streamableHttp.js");

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "warden-test", version: "0.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name).sort();
const asked = await client.callTool({
  name: "ask_agent",
  arguments: { agent: "quick", content: "When does the library open?", wait_s: 60 },
});
const halt = await client.callTool({ name: "halt", arguments: { agent: "quick" } });
console.log(
  JSON.stringify({
    server: client.getServerVersion(),
    tools,
    answer: asked.content.map((c) => c.text).join(""),
    asked_error: asked.isError ?? false,
    halt_error: halt.isError ?? false,
    halt_text: halt.content.map((c) => c.text).join(""),
  }),
);
await transport.terminateSession();
await client.close();
