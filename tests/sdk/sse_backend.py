"""A legacy HTTP+SSE backend (the Python SDK's own SSE server) behind toolmux.

Usage: sse_backend.py TOOLMUX_BINARY           runs the check
       sse_backend.py --serve PORT             (internal) serves the backend on PORT

The check starts the SDK's SSE server (2024-11-05 transport: GET /sse, POST /messages/), and a
toolmux gateway in passthrough mode with it as `transport = "sse"` twice: once shared, once
`per_client` with an identity header. Through the Python SDK's client it checks that the tools
are listed and called, that the backend's elicitation during a call reaches the caller and its
answer comes back, that the caller's identity header reaches the backend on its POSTs, and
that after the backend restarts (a new process on the same port: every SSE session gone) the
gateway connects afresh and calls go through again. Exits non-zero on the first failed check.
"""

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from mcp import Client


def serve(port: int) -> None:
    import uvicorn
    from mcp.server.mcpserver import Context, MCPServer
    from pydantic import BaseModel

    server = MCPServer("legacy")

    @server.tool()
    def shout(text: str) -> str:
        """Repeat the text in capitals."""
        return text.upper()

    @server.tool()
    def whoami(ctx: Context) -> str:
        """The X-User header of the request that carried this call."""
        request = ctx.request_context.request
        return request.headers.get("x-user", "(none)") if request is not None else "(no request)"

    class Name(BaseModel):
        name: str

    @server.tool()
    async def greet(ctx: Context) -> str:
        """Asks the client for a name (an elicitation relayed by toolmux) and greets it."""
        answer = await ctx.elicit("Who is there?", Name)
        return f"hello {answer.data.name}" if answer.action == "accept" else f"no name ({answer.action})"

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(server.sse_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"sse-backend: FAILED: {what}")


def text_of(result) -> str:
    return next((c.text for c in result.content if getattr(c, "type", None) == "text"), "")


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def is_ready(url: str) -> bool:
    try:
        return urllib.request.urlopen(url).status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_backend(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("sse-backend: the SSE server did not start")


async def answer(context, params):
    from mcp import types

    return types.ElicitResult(action="accept", content={"name": "sse"})


async def calls(url: str, expect_pid: str | None) -> str:
    async with Client(url, mode="legacy", elicitation_callback=answer) as client:
        names = sorted(t.name for t in (await client.list_tools()).tools)
        for prefix in ("legacy", "mine"):
            check({f"{prefix}_shout", f"{prefix}_whoami", f"{prefix}_greet", f"{prefix}_pid"} <= set(names), f"tools listed: {names}")
        shouted = await client.call_tool("legacy_shout", {"text": "through sse"})
        check(not shouted.is_error and text_of(shouted) == "THROUGH SSE", f"a call goes through: {shouted}")
        who = await client.call_tool("mine_whoami", {})
        check(text_of(who) == "anonymous", f"the caller's identity header reaches the backend: {text_of(who)}")
        shared_who = await client.call_tool("legacy_whoami", {})
        check(text_of(shared_who) == "(none)", f"the shared backend gets no identity: {text_of(shared_who)}")
        greeted = await client.call_tool("mine_greet", {})
        check(text_of(greeted) == "hello sse", f"the backend's elicitation is relayed to the caller: {greeted}")
        pid = text_of(await client.call_tool("legacy_pid", {}))
        if expect_pid is not None:
            check(pid == expect_pid, f"the restarted backend answers: {pid} != {expect_pid}")
        return pid


def main() -> None:
    if sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
        return
    binary = sys.argv[1]
    port = free_port()
    backend = start_backend(port)
    work = tempfile.mkdtemp()
    config = os.path.join(work, "sse.toml")
    with open(config, "w") as f:
        f.write(
            f"""[server]
listen = "127.0.0.1:0"
mode = "passthrough"
[[backends]]
name = "legacy"
url = "http://127.0.0.1:{port}/sse"
transport = "sse"
session = "shared"
[[backends]]
name = "mine"
url = "http://127.0.0.1:{port}/sse"
transport = "sse"
session = "per_client"
headers = {{ X-User = "${{client.principal}}" }}
"""
        )
    gateway = subprocess.Popen([binary, "serve", "--config", config], stdout=subprocess.PIPE, text=True)
    try:
        line = gateway.stdout.readline()
        check("listening on" in line, f"the gateway started: {line!r}")
        url = line.split()[-1]
        ready = url.removesuffix("/mcp") + "/readyz"
        deadline = time.monotonic() + 60
        while not is_ready(ready):
            check(time.monotonic() < deadline, "the gateway became ready")
            time.sleep(0.1)
        first = asyncio.run(calls(url, None))
        check(first == str(backend.pid), f"the backend's own process answered: {first}")

        # Every SSE session ends with its server; the gateway must connect to the new one.
        backend.terminate()
        backend.wait()
        backend = start_backend(port)
        deadline = time.monotonic() + 30
        while True:
            try:
                asyncio.run(calls(url, str(backend.pid)))
                break
            except BaseException as e:  # noqa: BLE001 - the SDK wraps failures in exception groups; retried until the deadline
                if time.monotonic() > deadline:
                    raise SystemExit(f"sse-backend: FAILED: no recovery after the backend restarted: {e}")
                time.sleep(0.2)
        print("sse-backend: listed, called, elicitation relayed, identity header carried, recovered after a restart")
    finally:
        gateway.terminate()
        backend.terminate()


if __name__ == "__main__":
    main()
