"""toolmux as the client of the MCP conformance suite's client scenarios.

Usage (by the suite's `client` mode): client.py TOOLMUX_BINARY SERVER_URL
  MCP_CONFORMANCE_SCENARIO names the scenario; MCP_CONFORMANCE_PROTOCOL_VERSION, when set, the
  revision the scenario speaks.

The suite starts a mock MCP server (and, for auth/*, a mock authorization server) and runs this
command with the server's URL. toolmux is configured with that URL as its one backend
(`auth = "oauth"` for the auth scenarios, after `toolmux login` with a headless browser: the
mock authorization server redirects at once, and following its redirect reaches toolmux's
loopback listener as a browser would). toolmux connects to the backend as it always does; this
script then acts as the MCP client in front of toolmux, over streamable HTTP, doing what the
scenario asks of a client (list the tools, call one, echo a schema, answer an elicitation).
Everything the mock server sees comes from toolmux. Only the standard library is used.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

SCENARIO = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
PROTOCOL = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "")
STATELESS = PROTOCOL >= "2026" and PROTOCOL != ""


def log(*args) -> None:
    print("toolmux-client:", *args, file=sys.stderr, flush=True)
    if os.environ.get("TOOLMUX_CONFORMANCE_LOG"):
        with open(os.environ["TOOLMUX_CONFORMANCE_LOG"], "a") as f:
            print(SCENARIO, *args, file=f)


class Gateway:
    """A minimal streamable HTTP client session against toolmux."""

    def __init__(self, url: str):
        self.url = url
        self.session = None
        self.next_id = 1
        self.on_request = None

    def post(self, message: dict) -> list[dict]:
        headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if self.session:
            headers["mcp-session-id"] = self.session
            headers["mcp-protocol-version"] = "2025-11-25"
        req = urllib.request.Request(self.url, data=json.dumps(message).encode(), headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=60) as resp:
            self.session = resp.headers.get("mcp-session-id", self.session)
            kind = resp.headers.get("content-type", "")
            if "text/event-stream" not in kind:
                body = resp.read()
                return [json.loads(body)] if body.strip() else []
            out = []
            data = []
            for raw in resp:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line == "" and data:
                    text = "\n".join(data)
                    data = []
                    if not text.strip():
                        continue
                    msg = json.loads(text)
                    if "method" in msg and "id" in msg and self.on_request:
                        # A request from the backend, relayed: answered on its own POST.
                        self.post({"jsonrpc": "2.0", "id": msg["id"], "result": self.on_request(msg)})
                        continue
                    out.append(msg)
                    if "id" in msg and msg.get("id") == message.get("id"):
                        break
            return out

    def request(self, method: str, params: dict | None = None) -> dict:
        mid = self.next_id
        self.next_id += 1
        answers = self.post({"jsonrpc": "2.0", "id": mid, "method": method, "params": params or {}})
        for a in answers:
            if a.get("id") == mid:
                if "error" in a:
                    raise RuntimeError(f"{method}: {a['error']}")
                return a["result"]
        raise RuntimeError(f"{method}: no answer")

    def open(self, capabilities: dict) -> None:
        self.request(
            "initialize",
            {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": {"name": "toolmux-conformance", "version": "0"}},
        )
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})


def first_line(proc: subprocess.Popen, pattern: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        found = re.search(pattern, line)
        if found:
            return found.group(0)
    raise SystemExit(f"toolmux-client: no line matching {pattern!r}")


def login(binary: str, config: str) -> None:
    """`toolmux login` with a headless browser that follows the authorization server's redirects."""
    proc = subprocess.Popen(
        [binary, "login", "conformance", "--config", config, "--no-browser", "--timeout", "20s"],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = first_line(proc, r"https?://\S+", 30)
    log("authorizing at", url)
    try:
        urllib.request.urlopen(url, timeout=20).read()
    except urllib.error.HTTPError as e:
        log("the authorization redirect ended with", e.code)
    except urllib.error.URLError as e:
        log("the authorization redirect failed:", e.reason)
    rest, _ = proc.communicate(timeout=30)
    log("login:", rest.strip().replace("\n", " | "))
    if proc.returncode != 0:
        log("toolmux login failed with", proc.returncode)


def ready(url: str) -> bool:
    try:
        return urllib.request.urlopen(url.removesuffix("/mcp") + "/readyz", timeout=5).status == 200
    except (urllib.error.URLError, OSError):
        return False


def needs_login(url: str) -> bool:
    status = json.load(urllib.request.urlopen(url.removesuffix("/mcp") + "/status", timeout=5))
    errors = [b.get("last_error") or "" for b in status.get("backends", [])]
    log("backend errors:", errors)
    return any("toolmux login" in e for e in errors)


def defaults_of(schema: dict) -> dict:
    return {k: p["default"] for k, p in schema.get("properties", {}).items() if isinstance(p, dict) and "default" in p}


def act(gw: Gateway, relogin) -> None:
    """What the scenario asks the client to do, through toolmux."""
    gw.on_request = lambda msg: (
        {"action": "accept", "content": defaults_of(msg["params"].get("requestedSchema", {}))}
        if msg["method"] == "elicitation/create"
        else {}
    )
    gw.open({"elicitation": {"form": {"applyDefaults": True}}, "sampling": {}, "roots": {}})
    tools = gw.request("tools/list")["tools"]
    if not tools and needs_login(gw.url):
        # As a user would: `toolmux status` names the backend and the command that fixes it.
        relogin()
        deadline = time.monotonic() + 45
        while not tools and time.monotonic() < deadline:
            time.sleep(0.2)
            tools = gw.request("tools/list")["tools"]
    names = [t["name"] for t in tools]
    log("tools through toolmux:", names)
    if SCENARIO == "json-schema-ref-no-deref" or SCENARIO == "request-metadata":
        return
    if SCENARIO == "json-schema-2020-12-preservation":
        focal = next(t for t in tools if t["name"] == "json_schema_2020_12_tool")
        gw.request("tools/call", {"name": "json_schema_echo", "arguments": {"schema": focal["inputSchema"]}})
        return
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    if context.get("toolCalls") or SCENARIO == "sep-2322-client-request-state":
        # Calls the scenario names (its context), or every tool it serves, in order.
        calls = context.get("toolCalls") or [{"name": t["name"], "arguments": {}} for t in tools]
        for call in calls:
            result = gw.request("tools/call", {"name": call["name"], "arguments": call.get("arguments", {})})
            log("called", call["name"], "->", json.dumps(result)[:200])
        return
    if not tools:
        return
    tool = tools[0]
    args = {"a": 2, "b": 3}
    result = gw.request("tools/call", {"name": tool["name"], "arguments": args})
    log("called", tool["name"], "->", json.dumps(result)[:300])
    # toolmux says when the backend wants a (new) login: more scope, or another authorization
    # server. The user runs the command it names; so does this client, then calls again.
    text = " ".join(c.get("text", "") for c in result.get("content", []))
    if result.get("isError") and "toolmux login" in text:
        relogin()
        result = gw.request("tools/call", {"name": tool["name"], "arguments": args})
        log("called again", tool["name"], "->", json.dumps(result)[:300])


def main() -> None:
    binary, server_url = sys.argv[1], sys.argv[-1]
    work = tempfile.mkdtemp()
    config = os.path.join(work, "toolmux.toml")
    auth = SCENARIO.startswith("auth/")
    protocol = 'protocol = "2026-07-28"\n' if STATELESS else ""
    # Pre-registered client credentials, when the scenario hands some over.
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    # Otherwise a Client ID Metadata Document, as a user who hosts one configures it (used only
    # where the authorization server says it accepts them; the suite's servers do not fetch it).
    oauth = '[backends.oauth]\nclient_metadata_url = "https://conformance-test.local/client-metadata.json"\n' if auth else ""
    if auth and context.get("client_id"):
        oauth = f'[backends.oauth]\nclient_id = "{context["client_id"]}"\n'
        if context.get("client_secret"):
            oauth += f'client_secret = "{context["client_secret"]}"\n'
    with open(config, "w") as f:
        f.write(
            f"""[server]
listen = "127.0.0.1:0"
mode = "passthrough"

[[backends]]
name = "conformance"
url = "{server_url}"
{protocol}{'auth = "oauth"' if auth else ''}
{oauth}
[aggregation]
conflict_resolution = "priority"
"""
        )
    env = dict(os.environ, TOOLMUX_CONFIG_DIR=os.path.join(work, "state"))
    os.environ["TOOLMUX_CONFIG_DIR"] = env["TOOLMUX_CONFIG_DIR"]
    if auth:
        login(binary, config)
    gateway = subprocess.Popen([binary, "serve", "--config", config], stdout=subprocess.PIPE, text=True, env=env)
    try:
        url = first_line(gateway, r"http://\S+", 30)
        deadline = time.monotonic() + 30
        while not ready(url):
            if time.monotonic() > deadline:
                raise SystemExit("toolmux-client: the gateway did not become ready")
            time.sleep(0.1)
        act(Gateway(url), lambda: login(binary, config))
    finally:
        gateway.terminate()
        gateway.wait(timeout=15)


if __name__ == "__main__":
    main()
