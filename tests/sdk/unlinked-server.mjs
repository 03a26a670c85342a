// A backend on the official TypeScript SDK's server side that asks its client for sampling
// without tying the request to the call that needs it (no related request id), as the SDK's
// example servers do: the SDK sends such a request only on the session's standalone GET stream,
// and drops it when that stream is not open yet. It answers each session's first GET 300 ms
// late, so that a client which sends its first call before its standalone stream is open loses
// the request (the call then never ends).
//
// Usage: node unlinked-server.mjs   (prints "unlinked backend listening on http://127.0.0.1:PORT/mcp")
import http from "node:http";
import { randomUUID } from "node:crypto";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";

const transports = new Map();

function newSession() {
  const server = new McpServer({ name: "unlinked", version: "1.0.0" });
  server.registerTool(
    "ask",
    { description: "Asks the client's model a question, outside the call's own stream", inputSchema: { question: z.string() } },
    async ({ question }) => {
      const answer = await server.server.createMessage({
        messages: [{ role: "user", content: { type: "text", text: question } }],
        maxTokens: 20,
      });
      return { content: [{ type: "text", text: `answered: ${answer.content.text}` }] };
    },
  );
  const transport = new StreamableHTTPServerTransport({
    sessionIdGenerator: () => randomUUID(),
    onsessioninitialized: (id) => transports.set(id, transport),
  });
  transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
  return { server, transport };
}

async function body(req) {
  const chunks = [];
  for await (const c of req) chunks.push(c);
  return chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
}

const delayed = new Set();
const httpServer = http.createServer(async (req, res) => {
  const id = req.headers["mcp-session-id"];
  if (req.method === "POST") {
    const parsed = await body(req);
    if (!id && isInitializeRequest(parsed)) {
      const { server, transport } = newSession();
      await server.connect(transport);
      return transport.handleRequest(req, res, parsed);
    }
    const transport = transports.get(id);
    if (!transport) return res.writeHead(404).end();
    return transport.handleRequest(req, res, parsed);
  }
  const transport = transports.get(id);
  if (!transport) return res.writeHead(404).end();
  if (req.method === "GET" && !delayed.has(id)) {
    delayed.add(id);
    await new Promise((r) => setTimeout(r, 300));
  }
  return transport.handleRequest(req, res);
});
httpServer.listen(0, "127.0.0.1", () => {
  console.log(`unlinked backend listening on http://127.0.0.1:${httpServer.address().port}/mcp`);
});
