// A host of MCP Apps in the browser, on the ext-apps SDK's host side (AppBridge): it connects to
// toolmux at /mcp (the page's own origin), finds the tool that shows an App, reads the App's
// HTML through toolmux, renders it in a sandboxed iframe, and hands it the tool's result. Calls
// the App makes go back through the bridge to toolmux. Bundled by apps.mjs; reports on
// `window.host` for the test to read.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { AppBridge, PostMessageTransport } from "@modelcontextprotocol/ext-apps/app-bridge";

window.host = { state: "starting" };
const fail = (e) => {
  window.host.state = "failed";
  window.host.error = String((e && e.stack) || e);
};

try {
  const client = new Client({ name: "toolmux-apps-host", version: "1.0" });
  await client.connect(new StreamableHTTPClientTransport(new URL("/mcp", location.href)));
  const { tools } = await client.listTools();
  const tool = tools.find((t) => t._meta?.ui?.resourceUri);
  if (!tool) throw new Error(`no tool shows an App: ${JSON.stringify(tools.map((t) => t.name))}`);
  const uri = tool._meta.ui.resourceUri;
  const read = await client.readResource({ uri });
  const html = read.contents[0];
  Object.assign(window.host, { tool: tool.name, uri, mimeType: html.mimeType, readUri: html.uri });

  const iframe = document.createElement("iframe");
  iframe.id = "app";
  iframe.setAttribute("sandbox", "allow-scripts");
  iframe.srcdoc = html.text;
  document.body.append(iframe);
  await new Promise((ok) => iframe.addEventListener("load", ok, { once: true }));

  const bridge = new AppBridge(client, { name: "toolmux-apps-host", version: "1.0" }, { serverTools: {}, logging: {}, openLinks: {} });
  bridge.oninitialized = async () => {
    try {
      window.host.state = "initialized";
      await bridge.sendToolInput({ arguments: {} });
      const result = await client.callTool({ name: tool.name, arguments: {} });
      window.host.firstTime = result.structuredContent?.time;
      await bridge.sendToolResult(result);
      window.host.state = "shown";
    } catch (e) {
      fail(e);
    }
  };
  await bridge.connect(new PostMessageTransport(iframe.contentWindow, iframe.contentWindow));
} catch (e) {
  fail(e);
}
