// The official TypeScript MCP SDK presenting agent hosts' names to toolmux in optimizer mode:
// each gets the surface docs/clients.md's table gives it (tests/sdk/hosts.py does every host
// with the Python SDK).
//
// Usage: node hosts.mjs URL
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url] = process.argv.slice(2);
const META_TOOLS = ["find_tool", "call_tool", "read_result"];

function check(cond, what) {
  if (!cond) {
    console.error(`typescript-sdk hosts: FAILED: ${what}`);
    process.exit(1);
  }
}

for (const [name, surface] of [["Visual Studio Code", "deferred"], ["cursor-vscode", "tools"]]) {
  const client = new Client({ name, version: "1.0" });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  await client.connect(transport);
  const said = client.getInstructions() || "";
  check(said.includes(`Surface: ${surface} (`), `${name}: initialize says the surface: ${said}`);
  const tools = (await client.listTools()).tools;
  const names = tools.map((t) => t.name);
  check(JSON.stringify(names.slice(0, 3)) === JSON.stringify(META_TOOLS), `${name}: the meta-tools first: ${names}`);
  if (surface === "deferred") {
    const pr = tools.find((t) => t.name === "github_create_pull_request");
    check(pr && (pr._meta?.["anthropic/searchHint"] || "").includes("pull"), `${name}: listed with a hint: ${JSON.stringify(pr)}`);
  } else {
    check(JSON.stringify(names) === JSON.stringify(META_TOOLS), `${name}: the meta-tools only: ${names}`);
  }
  await transport.terminateSession();
  await client.close();
}
console.log("typescript-sdk hosts: each host on its surface");
