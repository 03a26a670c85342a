#!/usr/bin/env bash
# The real Claude Code CLI (npm `@anthropic-ai/claude-code`) adds toolmux with its own `claude mcp`
# commands and checks it, with no account and a home folder of its own: `claude mcp list` must
# say it connected, and toolmux's audit trail must show that Claude Code was given the deferred
# surface (docs/clients.md) and listed its tools.
#
# Usage: claude-code.sh CLAUDE URL AUDIT_FILE
set -euo pipefail
claude=$1 url=$2 audit=$3
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT
cd "$home"
export HOME=$home
"$claude" mcp add --transport http toolmux "$url" > /dev/null
listed=$("$claude" mcp list 2>&1)
echo "$listed" | grep -q "toolmux: $url (HTTP) - ✔ Connected" || { echo "claude mcp list: $listed" >&2; exit 1; }
# The trail is written by a thread of its own: wait (10 s at most) for the lines to be there.
python3 - "$audit" <<'PY'
import json, sys, time
deadline = time.monotonic() + 10
while True:
    lines = [json.loads(l) for l in open(sys.argv[1])]
    starts = [l for l in lines if l["action"] == "initialize" and l.get("client") == "claude-code"]
    sessions = {l["session"] for l in starts}
    listed = any(l["action"] == "tools/list" and l.get("session") in sessions for l in lines)
    if starts and listed or time.monotonic() > deadline:
        break
    time.sleep(0.1)
if not starts or any(l["target"] != "deferred" for l in starts):
    sys.exit(f"claude-code: not on the deferred surface: {starts}")
if not listed:
    sys.exit("claude-code: never listed its tools")
print(f"claude-code: {len(starts)} session(s) on the deferred surface, tools listed")
PY
