"""Every agent host's stdio entry in docs/clients.md, checked as the host would use it.

Usage: clients.py TOOLMUX_BINARY CONFIG NODE_CLIENT

For each `<!-- connect: HOST -->` block: the text parses as that host's file format (JSON, Codex's
TOML, Goose's YAML) with the keys the host reads; toolmux's own reader (`toolmux import --json`)
reads the same command line back; and that command line, with the guide's placeholder paths
replaced by this checkout's binary and CONFIG, serves find_tool to the official TypeScript SDK's
stdio client (NODE_CLIENT is tests/sdk/client.mjs beside its node_modules). Exits non-zero on the
first failed check.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

import yaml

# Where each host reads its servers from, and the file name toolmux knows it by.
FILES = {
    "claude-desktop": "claude_desktop_config.json",
    "claude-code": ".mcp.json",
    "cursor": ".cursor/mcp.json",
    "vscode": ".vscode/mcp.json",
    "windsurf": ".codeium/windsurf/mcp_config.json",
    "gemini": ".gemini/settings.json",
    "codex": ".codex/config.toml",
    "cline": "cline_mcp_settings.json",
    "goose": ".config/goose/config.yaml",
}


def check(cond: bool, what: str) -> None:
    if not cond:
        raise SystemExit(f"clients: FAILED: {what}")


def command_line(host: str, text: str) -> list[str]:
    """The command line the host runs, read as the host reads its file."""
    if host == "codex":
        entry = tomllib.loads(text)["mcp_servers"]["toolmux"]
        return [entry["command"], *entry["args"]]
    if host == "goose":
        entry = yaml.safe_load(text)["extensions"]["toolmux"]
        check(entry["type"] == "stdio" and entry["enabled"] is True, f"goose: a stdio extension, enabled: {entry}")
        return [entry["cmd"], *entry["args"]]
    doc = json.loads(text)
    key = "servers" if host == "vscode" else "mcpServers"
    entry = doc[key]["toolmux"]
    if host in ("claude-code", "vscode"):
        check(entry.get("type") == "stdio", f"{host}: `type` is stdio: {entry}")
    return [entry["command"], *entry["args"]]


def main() -> None:
    binary, config, node_client = sys.argv[1:4]
    guide = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "clients.md")).read()
    blocks = re.findall(r"<!-- connect: ([a-z-]+) -->\n```\w+\n(.*?)```\n", guide, re.S)
    check(sorted(h for h, _ in blocks) == sorted(FILES), f"one stdio entry per host: {[h for h, _ in blocks]}")
    for host, text in blocks:
        text = text.replace("/path/to/toolmux.toml", config).replace("/path/to/toolmux", binary)
        argv = command_line(host, text)
        check(argv == [binary, "serve", "--stdio", "--config", config], f"{host}: the command line: {argv}")
        if host != "goose":
            # toolmux reads the entry back as it reads the host's file on import.
            with tempfile.TemporaryDirectory() as home:
                path = os.path.join(home, FILES[host])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
                out = subprocess.run([binary, "import", "--json", path], capture_output=True, text=True, check=True)
                backend = json.loads(out.stdout)["backends"][0]
                check([backend["command"], *backend["args"]] == argv, f"{host}: toolmux reads it back: {backend}")
        run = subprocess.run(["node", node_client, "optimizer", "--stdio", *argv], capture_output=True, text=True)
        check(run.returncode == 0, f"{host}: the TypeScript SDK client over stdio: {run.stderr[-2000:]}")
        read_back = "" if host == "goose" else " read back by toolmux,"
        print(f"clients: {host}: parsed,{read_back} served find_tool over stdio")


if __name__ == "__main__":
    main()
