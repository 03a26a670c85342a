"""One scripted session of the official Python MCP SDK, in its default mode, against toolmux.

Usage: client.py MODE URL [--legacy]
       client.py MODE --stdio COMMAND [ARG ...]

MODE is the gateway's mode (passthrough or optimizer). The gateway fronts the demo backends
`github` (HTTP) and `kit` (testkit, stdio). The client's default mode ("auto") discovers the
server and speaks 2026-07-28 without a session; `--legacy` runs the initialize handshake instead
(2025-11-25, a session ended by DELETE). Exits non-zero on the first failed check, and also if the
SDK logged a warning (such as a failed session termination).
"""

import asyncio
import json
import logging
import sys

from mcp import Client, StdioServerParameters

warnings: list[str] = []


class Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            warnings.append(f"{record.name}: {record.getMessage()}")


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"python-sdk: FAILED: {what}")


def text_of(result) -> str:
    return next((c.text for c in result.content if getattr(c, "type", None) == "text"), "")


# A fake AWS key (random, in the published shape): what the backend echoes must reach no client.
SAID = "from python with AKIAZ7VRSQ5NWXKQ2JMF"
SCRUBBED = "from python with [redacted: aws-access-token]"


ROWS = 30_000


async def read_back(client, mode: str, id: str) -> dict:
    """A kept structured result, read whole: with read_result in optimizer mode, page by page
    with resources/read in passthrough mode."""
    whole, offset = "", 0
    for page in range(1, 200):
        if mode == "optimizer":
            piece = await client.call_tool("read_result", {"id": id, "part": "structured", "offset": offset})
            check(not piece.is_error, f"read_result: {text_of(piece)}")
            whole += text_of(piece)
            step = piece.meta["toolmux/read"]
        else:
            read = await client.read_resource(f"toolmux://results/{id}/structured?page={page}")
            whole += read.contents[0].text
            step = read.contents[0].meta["toolmux/read"]
        if step["next"] is None:
            return json.loads(whole)
        offset = step["next"]
    raise SystemExit("python-sdk: FAILED: the kept result never ended")


async def session(mode: str, server, client_mode: str) -> int:
    checks = 0
    async with Client(server, mode=client_mode) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        if mode == "optimizer":
            check(names == ["find_tool", "call_tool", "read_result"], f"optimizer lists only its own tools: {names}")
            found = await client.call_tool("find_tool", {"tool_description": "create a pull request on a code repository"})
            check(not found.is_error, f"find_tool succeeded: {text_of(found)}")
            top = [t["name"] for t in found.structured_content["tools"]]
            check(top[:1] == ["github_create_pull_request"], f"find_tool ranks the right tool first: {top}")
            echoed = await client.call_tool("call_tool", {"tool_name": "kit_echo", "parameters": {"input": SAID}})
            checks += 2
        else:
            check("github_create_pull_request" in names and "kit_echo" in names, f"every backend's tools: {names}")
            echoed = await client.call_tool("kit_echo", {"input": SAID})
        # The credential the tool printed back is scrubbed ([results] scrub), the rest kept.
        check(not echoed.is_error and text_of(echoed) == SCRUBBED, f"a call goes through, scrubbed: {echoed}")
        checks += 2

        # A result over the limit arrives cut, still valid against the tool's outputSchema (the
        # SDK checks it against the schema it listed), and its caller reads the whole back.
        if mode == "optimizer":
            rows = await client.call_tool("call_tool", {"tool_name": "kit_rows", "parameters": {"count": ROWS}})
        else:
            rows = await client.call_tool("kit_rows", {"count": ROWS})
        cut = (rows.meta or {}).get("toolmux/cut") or {}
        got = rows.structured_content or {}
        check(not rows.is_error and cut.get("id"), f"a long result is cut and kept: {rows.meta}")
        check(0 < len(got.get("rows", [])) < ROWS and got.get("total") == ROWS, f"shortened, valid: {len(got.get('rows', []))}")
        whole = await read_back(client, mode, cut["id"])
        check(len(whole["rows"]) == ROWS and whole["rows"][-1]["id"] == ROWS - 1, "read back whole")
        checks += 3

        uris = [str(r.uri) for r in (await client.list_resources()).resources]
        check("demo://github/about" in uris, f"resources/list: {uris}")
        read = await client.read_resource("demo://github/about")
        check("github" in read.contents[0].text, f"resources/read: {read}")

        prompts = [p.name for p in (await client.list_prompts()).prompts]
        check("github_summarize" in prompts, f"prompts/list: {prompts}")
        prompt = await client.get_prompt("github_summarize", {"topic": "gateways"})
        check("gateways" in prompt.messages[0].content.text, f"prompts/get: {prompt}")
        checks += 4
    check(not warnings, f"the SDK logged warnings: {warnings}")
    return checks + 1


def main() -> None:
    logging.getLogger().addHandler(Collect())
    mode, target = sys.argv[1], sys.argv[2]
    client_mode = "auto"
    if target == "--stdio":
        server = StdioServerParameters(command=sys.argv[3], args=sys.argv[4:])
        transport = "stdio"
    else:
        server, transport = target, "http"
        if sys.argv[3:] == ["--legacy"]:
            client_mode = "legacy"
    checks = asyncio.run(session(mode, server, client_mode))
    print(f"python-sdk ({client_mode}) {mode} over {transport}: {checks} checks ok")


if __name__ == "__main__":
    main()
