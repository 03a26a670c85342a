#!/usr/bin/env python3
"""Derives a server-aware evaluation set from toolret-apigen.

Real MCP servers describe their service once (serverInfo title, instructions) and their tools
briefly ("Fetches the tracks of an album"). toolret-apigen's descriptions name their service
inline instead ("... from the Spotify API"). This script moves that name out of the tool into a
`server` record, so `toolmux eval` can measure what find_tool loses when a tool's text does not
name its service, and how much of it server-aware indexing wins back.

Rule (mechanical, no query or label is touched): a description with a phrase
`from|using|via|through|with|by|of|on|in [the] <Capitalised words> API|Service|service`
whose capitalised words are not only "RapidAPI"/"Toolbench" loses that phrase, and the tool gets
`"server": {"name": <slug>, "title": <the phrase's name>}`. Other tools are unchanged.

Writes, under eval/data/derived/ (not committed; rerun to regenerate) or the folder given as the
first argument:
  apigen-servers/   tools with the `server` record
  apigen-stripped/  the same tools without it (what a server-blind index sees)
  apigen-inline/    the original descriptions (the service named in every tool)
each with queries.dev.jsonl = the dev queries at least one of whose gold tools has a server.
"""

import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent / "data"
SOURCE = ROOT / "toolret-apigen"
OUT = ROOT / "derived"

PHRASE = re.compile(
    r"\s*,?\s*\b(?:from|using|via|through|with|by|of|on|in)\s+(?:the\s+)?"
    r"((?:[A-Z0-9][\w.&'-]*\s+){1,5}?(?:API|Service|service))\b(?:\s+(?:service|endpoint))?"
)
GENERIC = {"RapidAPI", "Toolbench RapidAPI", "Toolbench", "RapidAPI Toolbench"}


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def main() -> None:
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    tools = [json.loads(line) for line in (SOURCE / "tools.jsonl").open()]
    queries = [json.loads(line) for line in (SOURCE / "queries.dev.jsonl").open()]
    with_server, stripped = [], []
    served = set()
    for tool in tools:
        match = PHRASE.search(tool["description"])
        title = match.group(1) if match else None
        core = re.sub(r"\s+(API|Service|service)$", "", title) if title else None
        if match is None or core in GENERIC:
            with_server.append(tool)
            stripped.append(tool)
            continue
        served.add(tool["name"])
        d = tool["description"]
        bare = dict(tool, description=(d[: match.start()] + d[match.end() :]).strip())
        stripped.append(bare)
        with_server.append(dict(bare, server={"name": slug(title), "title": title}))
    kept = [q for q in queries if any(g in served for g in q["gold"])]
    for name, rows in [("apigen-servers", with_server), ("apigen-stripped", stripped), ("apigen-inline", tools)]:
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "tools.jsonl").open("w") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        with (folder / "queries.dev.jsonl").open("w") as f:
            for q in kept:
                f.write(json.dumps(q, ensure_ascii=False) + "\n")
    print(f"{len(served)} of {len(tools)} tools got a server; {len(kept)} of {len(queries)} queries kept; wrote {out}")


if __name__ == "__main__":
    main()
