// MCP Apps through toolmux, with the official example server (@modelcontextprotocol/server-basic-
// vanillajs, a toolmux backend named `vanilla` over stdio), the ext-apps SDK's host side and
// Debian's headless Chromium.
//
// Usage: node apps.mjs URL CHROMIUM [OPTIMIZER_URL]
//
// The gateway (passthrough) lets alice use every backend, bob only `kit`, and carol only
// vanilla's `get-time`. Checked with the MCP client over HTTP: the tool's links to its App are
// served under the backend's name; alice and carol read the App's HTML under that name, bob
// (no tool that shows it) gets "not found"; the App's own call by its server's tool name reaches
// the tool. Then in Chromium: a host page (tests/sdk/apps/host.mjs, bundled with esbuild) reads
// the App through toolmux, renders it, hands it the tool's result, and a click in the App calls
// the tool again through the host and toolmux. With OPTIMIZER_URL (the same gateway in optimizer
// mode), find_tool's answer and call_tool's result carry the link to the App, and the App's call
// by its server's tool name still reaches the tool.
import http from "node:http";
import path from "node:path";
import { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";
import puppeteer from "puppeteer-core";
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [url, chromium, optimizerUrl] = process.argv.slice(2);
const here = path.dirname(fileURLToPath(import.meta.url));
const APP = "ui://vanilla/get-time/mcp-app.html";
const MIME = "text/html;profile=mcp-app";
let checks = 0;

function check(cond, what) {
  if (!cond) {
    console.error(`apps: FAILED: ${what}`);
    process.exit(1);
  }
  checks += 1;
}

async function connect(token, at = url) {
  const client = new Client({ name: "apps-check", version: "1.0" });
  const headers = { Authorization: `Bearer ${token}` };
  await client.connect(new StreamableHTTPClientTransport(new URL(at), { requestInit: { headers } }));
  return client;
}

async function refused(promise) {
  try {
    await promise;
    return null;
  } catch (e) {
    return e;
  }
}

// Over MCP: the links, who reads the App, and an App's call by its server's own tool name.
const alice = await connect("alice");
const tool = (await alice.listTools()).tools.find((t) => t.name === "vanilla_get-time");
check(tool, "vanilla_get-time is listed");
check(tool._meta?.ui?.resourceUri === APP, `the App link is served under the backend's name: ${JSON.stringify(tool._meta)}`);
check(tool._meta?.["ui/resourceUri"] === APP, "so is the older flat key");
const read = await alice.readResource({ uri: APP });
check(read.contents[0].uri === APP && read.contents[0].mimeType === MIME, `the App's HTML: ${read.contents[0].uri} ${read.contents[0].mimeType}`);
check(read.contents[0].text.includes("get-time-btn"), "the App's HTML is the server's");
const listed = (await alice.listResources()).resources.map((r) => r.uri);
check(listed.includes(APP), `resources/list names the App under the backend's name: ${listed}`);
const byOwnName = await alice.callTool({ name: "get-time", arguments: {} });
check(!byOwnName.isError && byOwnName.structuredContent?.time, `an App's call by the server's own name: ${JSON.stringify(byOwnName)}`);

const bob = await connect("bob");
check(!(await bob.listTools()).tools.some((t) => t.name.startsWith("vanilla_")), "bob lists no vanilla tool");
const denied = await refused(bob.readResource({ uri: APP }));
check(denied && String(denied.code) === "-32002", `bob may use no tool that shows the App: ${denied}`);
const bobCall = await refused(bob.callTool({ name: "get-time", arguments: {} }));
check(bobCall, "nor call its tool by the server's name");

const carol = await connect("carol");
const carols = await carol.readResource({ uri: APP });
check(carols.contents[0].text.includes("get-time-btn"), "carol may use get-time, so she reads its App");
const other = await refused(carol.readResource({ uri: "ui://vanilla/nothing-else.html" }));
check(other && String(other.code) === "-32002", "an App no tool of hers shows is not found");
for (const c of [alice, bob, carol]) await c.close();

// Optimizer mode: a host that meets the tool through find_tool and call_tool still gets its App.
if (optimizerUrl) {
  const agent = await connect("alice", optimizerUrl);
  const found = await agent.callTool({ name: "find_tool", arguments: { tool_description: "get the current server time" } });
  const entry = (found.structuredContent?.tools || []).find((t) => t.name === "vanilla_get-time");
  check(entry?._meta?.ui?.resourceUri === APP, `find_tool's answer links the App: ${JSON.stringify(entry)}`);
  const called = await agent.callTool({ name: "call_tool", arguments: { tool_name: "vanilla_get-time", parameters: {} } });
  check(!called.isError && called._meta?.ui?.resourceUri === APP, `call_tool's result links the App: ${JSON.stringify(called._meta)}`);
  const own = await agent.callTool({ name: "get-time", arguments: {} });
  check(!own.isError && own.structuredContent?.time, `the App's call by the server's own name: ${JSON.stringify(own)}`);
  const html = await agent.readResource({ uri: APP });
  check(html.contents[0].mimeType === MIME, "the App's HTML reads the same in optimizer mode");
  await agent.close();
}

// In Chromium: the ext-apps host side renders the App read through toolmux.
const bundle = await esbuild.build({
  entryPoints: [path.join(here, "host.mjs")],
  bundle: true,
  format: "esm",
  platform: "browser",
  target: "es2022",
  write: false,
  logLevel: "error",
});
const hostJs = bundle.outputFiles[0].text;
let proxiedCalls = 0;
const server = http.createServer(async (req, res) => {
  if (req.url === "/") {
    res.writeHead(200, { "content-type": "text/html" });
    return res.end('<!doctype html><meta charset="utf-8"><title>host</title><body><script type="module" src="/host.js"></script></body>');
  }
  if (req.url === "/host.js") {
    res.writeHead(200, { "content-type": "text/javascript" });
    return res.end(hostJs);
  }
  if (!req.url.startsWith("/mcp")) {
    res.writeHead(404);
    return res.end();
  }
  // The page's MCP traffic, to toolmux as alice (a page cannot reach another origin's /mcp).
  const chunks = [];
  for await (const c of req) chunks.push(c);
  const body = Buffer.concat(chunks);
  if (body.includes('"tools/call"')) proxiedCalls += 1;
  const headers = { authorization: "Bearer alice" };
  for (const h of ["content-type", "accept", "mcp-session-id", "mcp-protocol-version", "last-event-id"]) {
    if (req.headers[h]) headers[h] = req.headers[h];
  }
  const answer = await fetch(url, { method: req.method, headers, body: ["GET", "HEAD"].includes(req.method) ? undefined : body });
  const out = {};
  answer.headers.forEach((v, k) => {
    if (!["content-length", "content-encoding", "transfer-encoding", "connection"].includes(k)) out[k] = v;
  });
  res.writeHead(answer.status, out);
  if (answer.body) Readable.fromWeb(answer.body).pipe(res);
  else res.end();
});
await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
const page_url = `http://127.0.0.1:${server.address().port}/`;

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
});
try {
  const page = await browser.newPage();
  const logs = [];
  page.on("console", (m) => logs.push(m.text()));
  await page.goto(page_url);
  await page.waitForFunction(() => window.host && ["shown", "failed"].includes(window.host.state), { timeout: 60_000 });
  const host = await page.evaluate(() => window.host);
  check(host.state === "shown", `the host rendered the App: ${host.error}\n${logs.join("\n")}`);
  check(host.uri === APP && host.readUri === APP && host.mimeType === MIME, `read through toolmux: ${JSON.stringify(host)}`);
  const frame = await (await page.$("#app")).contentFrame();
  const shows = (t) => frame.waitForFunction((t) => document.querySelector("#server-time")?.textContent.includes(t), { timeout: 30_000 }, t);
  await shows(host.firstTime);
  checks += 1;
  // The App's own button: a tools/call from the App, through the bridge, the page and toolmux.
  const before = proxiedCalls;
  await frame.click("#get-time-btn");
  await frame.waitForFunction(
    (t) => {
      const shown = document.querySelector("#server-time")?.textContent || "";
      return /\d{4}-\d\d-\d\dT/.test(shown) && !shown.includes(t);
    },
    { timeout: 30_000 },
    host.firstTime,
  );
  check(proxiedCalls > before, "the App's call went through toolmux");
} finally {
  await browser.close();
  server.closeAllConnections();
  server.close();
}
console.log(`apps: ${checks} checks ok`);
// The page's standalone stream from toolmux, proxied, would keep the process waiting.
process.exit(0);
