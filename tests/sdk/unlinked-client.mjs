// Five fresh sessions of the official TypeScript SDK client, each calling `unlinked_ask` through
// toolmux (passthrough) in front of unlinked-server.mjs: the backend's sampling request, sent on
// its standalone stream, must reach the session whose call needs it, every time.
//
// Usage: node unlinked-client.mjs URL
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { CreateMessageRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const url = new URL(process.argv[2]);
for (let i = 0; i < 5; i++) {
  const client = new Client({ name: `asker-${i}`, version: "0" }, { capabilities: { sampling: {} } });
  client.setRequestHandler(CreateMessageRequestSchema, async () => ({
    role: "assistant",
    content: { type: "text", text: `client ${i}` },
    model: "test",
  }));
  const transport = new StreamableHTTPClientTransport(url);
  await client.connect(transport);
  const result = await client.callTool({ name: "unlinked_ask", arguments: { question: `question ${i}` } });
  const text = (result.content.find((c) => c.type === "text") || {}).text;
  if (result.isError || text !== `answered: client ${i}`) {
    console.error(`unlinked: FAILED: session ${i} got ${JSON.stringify(result)}`);
    process.exit(1);
  }
  await transport.terminateSession();
  await client.close();
}
console.log("unlinked: 5 sessions, each asked for sampling on the backend's standalone stream, each answered");
