"""The official Python MCP SDK presenting each agent host's name and capabilities to toolmux in
optimizer mode: each gets the surface docs/clients.md's table gives it.

Usage: hosts.py URL

The gateway fronts the demo backends `github` and `kit` with `[groups] enabled = true`. Each host
connects twice: with the SDK's default (2026-07-28, no session: the name travels with every
request) and with the initialize handshake (whose answer says which surface and why). Exits
non-zero on the first failed check.
"""

import asyncio
import sys

from mcp import Client
from mcp.client.extension import advertise
from mcp.types import Implementation

META_TOOLS = ["find_tool", "call_tool", "read_result"]


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"python-sdk hosts: FAILED: {what}")


# (clientInfo.name, declares groups, the surface docs/clients.md gives it)
HOSTS = [
    ("claude-code", False, "deferred"),
    ("Visual Studio Code", False, "deferred"),
    ("cursor-vscode", False, "tools"),
    ("claude-ai", False, "tools"),
    ("gemini-cli-mcp-client", False, "tools"),
    ("an-agent-of-groups", True, "groups"),
]


async def one(url: str, name: str, groups: bool, surface: str, mode: str) -> int:
    extensions = [advertise("io.modelcontextprotocol/groups")] if groups else None
    info = Implementation(name=name, version="1.0")
    async with Client(url, mode=mode, client_info=info, extensions=extensions) as client:
        where = f"{name} ({mode})"
        if mode == "legacy":
            said = client.instructions or ""
            check(f"Surface: {surface} (" in said, f"{where}: initialize says the surface: {said!r}")
        tools = (await client.list_tools()).tools
        names = [t.name for t in tools]
        check(names[:3] == META_TOOLS, f"{where}: find_tool and call_tool on every surface: {names}")
        if surface == "deferred":
            pr = next((t for t in tools if t.name == "github_create_pull_request"), None)
            check(pr is not None and "kit_echo" in names, f"{where}: every tool listed: {names}")
            meta = pr.meta or {}
            check("pull" in meta.get("anthropic/searchHint", ""), f"{where}: a search hint: {meta}")
            check(meta.get("anthropic/maxResultSizeChars", 0) > 0, f"{where}: a result size: {meta}")
            echoed = await client.call_tool("kit_echo", {"input": "by name"})
            check(not echoed.is_error, f"{where}: a listed tool is called by its name")
        else:
            check(names == META_TOOLS, f"{where}: the meta-tools only: {names}")
            # A group's tools are called by name; on `tools`, through call_tool only.
            echoed = await client.call_tool("kit_echo", {"input": "by name"})
            check(echoed.is_error == (surface == "tools"), f"{where}: kit_echo by its name on {surface}")
            found = await client.call_tool("find_tool", {"tool_description": "open a pull request"})
            check(not found.is_error, f"{where}: find_tool answers")
    return 1


async def main() -> None:
    url = sys.argv[1]
    n = 0
    for name, groups, surface in HOSTS:
        for mode in ("auto", "legacy"):
            n += await one(url, name, groups, surface, mode)
    print(f"python-sdk hosts: {n} sessions, each on its host's surface")


asyncio.run(main())
