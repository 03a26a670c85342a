// One scripted session of the official TypeScript MCP SDK, in its default mode, against toolmux.
//
// Usage: node client.mjs MODE URL
//        node client.mjs MODE --stdio COMMAND [ARG ...]
//
// MODE is the gateway's mode (passthrough or optimizer). The gateway fronts the demo backends
// `github` (HTTP) and `kit` (testkit, stdio). Exits non-zero on the first failed check. Over HTTP
// the session is ended with DELETE, which the SDK reports as an error unless it succeeds.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [mode, target, ...rest] = process.argv.slice(2);
let checks = 0;

function check(cond, what) {
  if (!cond) {
    console.error(`typescript-sdk: FAILED: ${what}`);
    process.exit(1);
  }
  checks += 1;
}

const textOf = (result) => (result.content.find((c) => c.type === "text") || {}).text || "";

const stdio = target === "--stdio";
const transport = stdio
  ? new StdioClientTransport({ command: rest[0], args: rest.slice(1), stderr: "ignore" })
  : new StreamableHTTPClientTransport(new URL(target));
const client = new Client({ name: "toolmux-sdk-test", version: "0" });
await client.connect(transport);

// A fake AWS key (random, in the published shape): what the backend echoes must reach no client.
const SAID = "from typescript with AKIAZ7VRSQ5NWXKQ2JMF";
const SCRUBBED = "from typescript with [redacted: aws-access-token]";

const names = (await client.listTools()).tools.map((t) => t.name);
let echoed;
if (mode === "optimizer") {
  check(JSON.stringify(names) === JSON.stringify(["find_tool", "call_tool", "read_result"]), `optimizer lists only its own tools: ${names}`);
  const found = await client.callTool({
    name: "find_tool",
    arguments: { tool_description: "create a pull request on a code repository" },
  });
  check(!found.isError, `find_tool succeeded: ${textOf(found)}`);
  const top = found.structuredContent.tools.map((t) => t.name);
  check(top[0] === "github_create_pull_request", `find_tool ranks the right tool first: ${top}`);
  echoed = await client.callTool({
    name: "call_tool",
    arguments: { tool_name: "kit_echo", parameters: { input: SAID } },
  });
} else {
  check(names.includes("github_create_pull_request") && names.includes("kit_echo"), `every backend's tools: ${names}`);
  echoed = await client.callTool({ name: "kit_echo", arguments: { input: SAID } });
}
// The credential the tool printed back is scrubbed ([results] scrub), the rest kept.
check(!echoed.isError && textOf(echoed) === SCRUBBED, `a call goes through, scrubbed: ${JSON.stringify(echoed)}`);

// A result over the limit arrives cut, still valid against the tool's outputSchema (the SDK
// checks it against the schema it listed), and its caller reads the whole back.
const ROWS = 30000;
const rows =
  mode === "optimizer"
    ? await client.callTool({ name: "call_tool", arguments: { tool_name: "kit_rows", parameters: { count: ROWS } } })
    : await client.callTool({ name: "kit_rows", arguments: { count: ROWS } });
const cut = (rows._meta || {})["toolmux/cut"] || {};
check(!rows.isError && cut.id, `a long result is cut and kept: ${JSON.stringify(rows._meta)}`);
const got = rows.structuredContent || {};
check(got.rows.length > 0 && got.rows.length < ROWS && got.total === ROWS, `shortened, valid: ${got.rows.length}`);
let kept = "";
for (let page = 1, offset = 0; ; page += 1) {
  check(page < 200, "the kept result ends");
  let step;
  if (mode === "optimizer") {
    const piece = await client.callTool({ name: "read_result", arguments: { id: cut.id, part: "structured", offset } });
    kept += textOf(piece);
    step = piece._meta["toolmux/read"];
  } else {
    const read = await client.readResource({ uri: `toolmux://results/${cut.id}/structured?page=${page}` });
    kept += read.contents[0].text;
    step = read.contents[0]._meta["toolmux/read"];
  }
  if (step.next === null) break;
  offset = step.next;
}
const whole = JSON.parse(kept);
check(whole.rows.length === ROWS && whole.rows[ROWS - 1].id === ROWS - 1, "read back whole");

const uris = (await client.listResources()).resources.map((r) => r.uri);
check(uris.includes("demo://github/about"), `resources/list: ${uris}`);
const read = await client.readResource({ uri: "demo://github/about" });
check(read.contents[0].text.includes("github"), `resources/read: ${JSON.stringify(read)}`);

const prompts = (await client.listPrompts()).prompts.map((p) => p.name);
check(prompts.includes("github_summarize"), `prompts/list: ${prompts}`);
const prompt = await client.getPrompt({ name: "github_summarize", arguments: { topic: "gateways" } });
check(prompt.messages[0].content.text.includes("gateways"), `prompts/get: ${JSON.stringify(prompt)}`);

if (!stdio) {
  await transport.terminateSession();
  check(transport.sessionId === undefined, "DELETE ended the session");
}
await client.close();
console.log(`typescript-sdk ${mode} over ${stdio ? "stdio" : "http"}: ${checks} checks ok`);
