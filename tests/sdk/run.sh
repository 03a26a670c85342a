#!/usr/bin/env bash
# The official MCP SDK clients, in their default modes, against toolmux: the Python SDK (PyPI
# `mcp`) and the TypeScript SDK (npm `@modelcontextprotocol/sdk`), each running one scripted
# session (tests/sdk/client.py, client.mjs) against the gateway in both modes, over HTTP and over
# stdio. The Python SDK's legacy mode (the initialize handshake, a session ended by DELETE) runs
# over HTTP as well. The gateway fronts two demo backends: `github` over HTTP and `kit` (testkit)
# over stdio.
#
# A TypeScript SDK server as a backend (tests/sdk/unlinked-server.mjs) checks that a backend
# request tied to no call reaches the session whose call needs it. The Python SDK's legacy SSE
# server as a `transport = "sse"` backend (tests/sdk/sse_backend.py) checks the 2024-11-05
# transport: calls, identity headers, and a fresh connection after the backend restarts. Every
# agent host's entry in docs/clients.md is run as written (tests/sdk/clients.py), and the Python
# SDK presents each host's name and capabilities to get the surface docs/clients.md gives it
# (tests/sdk/hosts.py); the real Claude Code CLI adds toolmux with `claude mcp add` and checks it
# with `claude mcp list`, no account needed (tests/sdk/claude-code.sh). MCP Apps: the official
# example server behind toolmux, its App read and rendered in Chromium by the ext-apps SDK's host
# side (tests/sdk/apps).
#
# Installs the pinned SDKs and Claude Code into a cache folder on first use (a Python virtual
# environment, and npm prefixes), and redis-server (scripts/redis.sh). Needs python3 with venv, node ≥ 18 and npm.
set -euo pipefail
# A command that ends the script (set -e) names its line, so a failure is never silent.
trap 'echo "sdk: stopped at line $LINENO (exit $?)" >&2' ERR
cd "$(dirname "$0")/../.."
root=$PWD
python_sdk=2.3.0
typescript_sdk=1.32.2
claude_code=2.1.197
ext_apps=2.0.4
apps_server=2.0.3
esbuild=0.25.10
puppeteer=24.22.0
pyyaml=6.0.2
cache="${XDG_CACHE_HOME:-$HOME/.cache}/toolmux/sdk"
target="${CARGO_TARGET_DIR:-$root/target}"
. tests/support.sh

venv="$cache/python-mcp-$python_sdk"
# PyYAML reads Goose's entry in docs/clients.md (tests/sdk/clients.py).
if ! "$venv/bin/python" -c "import mcp, yaml" 2>/dev/null; then
  echo "sdk: installing mcp==$python_sdk and pyyaml==$pyyaml into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$python_sdk" "pyyaml==$pyyaml"
fi
npm_prefix="$cache/typescript-sdk-$typescript_sdk"
claude_prefix="$cache/claude-code-$claude_code"
# MCP Apps: the official example server, the ext-apps SDK's host side, esbuild to bundle the
# host page, and puppeteer-core to drive Chromium (tests/sdk/apps).
apps_prefix="$cache/mcp-apps-$ext_apps"
if [ ! -f "$apps_prefix/node_modules/@modelcontextprotocol/server-basic-vanillajs/package.json" ]; then
  echo "sdk: installing @modelcontextprotocol/ext-apps@$ext_apps and its example server into $apps_prefix"
  mkdir -p "$apps_prefix"
  echo '{"private": true, "type": "module"}' > "$apps_prefix/package.json"
  npm install --prefix "$apps_prefix" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/ext-apps@$ext_apps" "@modelcontextprotocol/server-basic-vanillajs@$apps_server" \
    "esbuild@$esbuild" "puppeteer-core@$puppeteer"
fi
cp tests/sdk/apps/apps.mjs tests/sdk/apps/host.mjs "$apps_prefix/"
if [ ! -x "$claude_prefix/node_modules/.bin/claude" ]; then
  echo "sdk: installing @anthropic-ai/claude-code@$claude_code into $claude_prefix"
  mkdir -p "$claude_prefix"
  echo '{"private": true}' > "$claude_prefix/package.json"
  npm install --prefix "$claude_prefix" --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@$claude_code"
fi
if [ ! -f "$npm_prefix/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
  echo "sdk: installing @modelcontextprotocol/sdk@$typescript_sdk into $npm_prefix"
  mkdir -p "$npm_prefix"
  echo '{"private": true, "type": "module"}' > "$npm_prefix/package.json"
  npm install --prefix "$npm_prefix" --no-audit --no-fund --loglevel=error "@modelcontextprotocol/sdk@$typescript_sdk"
fi
# Node resolves the SDK from the script's own folder: run copies that sit beside node_modules.
cp tests/sdk/client.mjs tests/sdk/hosts.mjs tests/sdk/unlinked-server.mjs tests/sdk/unlinked-client.mjs "$npm_prefix/"

# `--tests` resolves features as `cargo test` does (dev-dependencies included), so after the
# test suite this is the binary it already built; without it a cold run compiles every
# dependency a second time (4-5 minutes on two cores).
cargo build --locked --bin toolmux --tests
bin="$target/debug/toolmux"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

"$bin" backend github --listen 127.0.0.1:0 > "$work/github.out" 2> "$work/github.out.err" &
pids+=($!)
github_url=$(first_line "$work/github.out" "the github backend")

passed=0
failed=0
run() {
  echo "sdk: $(date +%T) $1" >&2
  local label=$1; shift
  if "$@" 2> "$work/client.err"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "sdk: $label failed:" >&2
    tail -30 "$work/client.err" >&2
  fi
}

# The gateway's configuration in MODE fronting both backends, with EXTRA (TOML) after [server].
gateway_config() {
  cat <<TOML
[server]
listen = "127.0.0.1:0"
mode = "$1"
${2:-}
[[backends]]
name = "github"
url = "$github_url"

[[backends]]
name = "kit"
command = "$bin"
args = ["backend", "testkit", "--stdio"]
TOML
}

for mode in passthrough optimizer; do
  config="$work/$mode.toml"
  # Groups on in optimizer mode: only a client that declares them sees a difference (hosts.py).
  extra=""
  [ "$mode" = optimizer ] && extra=$(printf '[groups]\nenabled = true')
  gateway_config "$mode" "$extra" > "$config"
  "$bin" serve --config "$config" > "$work/gateway.out" 2> "$work/gateway.out.err" &
  gateway=$!
  pids+=("$gateway")
  url=$(first_line "$work/gateway.out" "toolmux ($mode)" | grep -o 'http://[^ ]*')
  wait_ready "$url"

  run "python-sdk $mode http" "$venv/bin/python" tests/sdk/client.py "$mode" "$url"
  run "python-sdk (legacy) $mode http" "$venv/bin/python" tests/sdk/client.py "$mode" "$url" --legacy
  run "typescript-sdk $mode http" node "$npm_prefix/client.mjs" "$mode" "$url"
  if [ "$mode" = optimizer ]; then
    run "python-sdk as each agent host" "$venv/bin/python" tests/sdk/hosts.py "$url"
    run "typescript-sdk as agent hosts" node "$npm_prefix/hosts.mjs" "$url"
  fi
  run "python-sdk $mode stdio" "$venv/bin/python" tests/sdk/client.py "$mode" --stdio "$bin" serve --stdio --config "$config"
  run "typescript-sdk $mode stdio" node "$npm_prefix/client.mjs" "$mode" --stdio "$bin" serve --stdio --config "$config"

  kill "$gateway"
  wait "$gateway" 2>/dev/null || true
  : > "$work/gateway.out"
done

# The real Claude Code CLI against a gateway of its own, whose audit trail says what it was given.
gateway_config optimizer "$(printf '[audit]\nfile = "%s"' "$work/audit.jsonl")" > "$work/claude.toml"
"$bin" serve --config "$work/claude.toml" > "$work/gateway.out" 2> "$work/gateway.out.err" &
gateway=$!
pids+=("$gateway")
url=$(first_line "$work/gateway.out" "toolmux (claude code)" | grep -o 'http://[^ ]*')
wait_ready "$url"
run "claude code's own claude mcp commands" tests/sdk/claude-code.sh "$claude_prefix/node_modules/.bin/claude" "$url" "$work/audit.jsonl"
kill "$gateway"
wait "$gateway" 2>/dev/null || true
: > "$work/gateway.out"

# MCP Apps: the official example server behind toolmux, read and rendered in Chromium by the
# ext-apps host side, its App calling back through toolmux (tests/sdk/apps/apps.mjs).
scripts/chromium.sh
chromium=$(command -v chromium || command -v chromium-browser)
token_hash() { python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest())' "$1"; }
{
  printf '[server]\nlisten = "127.0.0.1:0"\nmode = "passthrough"\n[auth]\nmode = "bearer"\n'
  for p in alice bob carol; do printf '[[auth.tokens]]\nprincipal = "%s"\nsha256 = "%s"\n' "$p" "$(token_hash "$p")"; done
  printf '[[policy]]\nprincipals = ["alice"]\nbackends = ["*"]\n'
  printf '[[policy]]\nprincipals = ["bob"]\nbackends = ["kit"]\n'
  printf '[[policy]]\nprincipals = ["carol"]\nbackends = ["vanilla"]\ntools = ["get-time"]\n'
  printf '[[backends]]\nname = "vanilla"\ncommand = "node"\nargs = ["%s", "--stdio"]\n' \
    "$apps_prefix/node_modules/@modelcontextprotocol/server-basic-vanillajs/dist/index.js"
  printf '[[backends]]\nname = "kit"\ncommand = "%s"\nargs = ["backend", "testkit", "--stdio"]\n' "$bin"
} > "$work/apps.toml"
sed 's/^mode = "passthrough"$/mode = "optimizer"/' "$work/apps.toml" > "$work/apps-optimizer.toml"
"$bin" serve --config "$work/apps.toml" > "$work/gateway.out" 2> "$work/gateway.out.err" &
gateway=$!
"$bin" serve --config "$work/apps-optimizer.toml" > "$work/optimizer.out" 2> "$work/optimizer.out.err" &
optimizer=$!
pids+=("$gateway" "$optimizer")
url=$(first_line "$work/gateway.out" "toolmux (apps)" | grep -o 'http://[^ ]*')
optimizer_url=$(first_line "$work/optimizer.out" "toolmux (apps, optimizer)" | grep -o 'http://[^ ]*')
wait_ready "$url"
wait_ready "$optimizer_url"
run "mcp apps through toolmux, rendered in chromium" node "$apps_prefix/apps.mjs" "$url" "$chromium" "$optimizer_url"
kill "$gateway" "$optimizer"
wait "$gateway" "$optimizer" 2>/dev/null || true
: > "$work/gateway.out"

# Each agent host's entry in docs/clients.md, parsed as its host does and run as written with the
# TypeScript SDK's stdio client (the hosts' own way to start a server).
run "every host's entry in docs/clients.md" "$venv/bin/python" tests/sdk/clients.py "$bin" "$work/optimizer.toml" "$npm_prefix/client.mjs"

# A backend on the TypeScript SDK's server side that asks for sampling on its standalone stream
# (tied to no call) and opens that stream late: each new backend session's first call must wait
# for the stream, or the backend drops its request and the call never ends.
node "$npm_prefix/unlinked-server.mjs" > "$work/unlinked.out" 2> "$work/unlinked.out.err" &
pids+=($!)
unlinked_url=$(first_line "$work/unlinked.out" "the unlinked backend" | grep -o 'http://[^ ]*')
cat > "$work/unlinked.toml" <<TOML
[server]
listen = "127.0.0.1:0"
mode = "passthrough"
[[backends]]
name = "unlinked"
url = "$unlinked_url"
timeout = "5s"
TOML
"$bin" serve --config "$work/unlinked.toml" > "$work/gateway.out" 2> "$work/gateway.out.err" &
gateway=$!
pids+=("$gateway")
url=$(first_line "$work/gateway.out" "toolmux (unlinked)" | grep -o 'http://[^ ]*')
wait_ready "$url"
run "typescript-sdk backend asking on its standalone stream" node "$npm_prefix/unlinked-client.mjs" "$url"
kill "$gateway"
wait "$gateway" 2>/dev/null || true

# A legacy HTTP+SSE backend: the Python SDK's own SSE server.
run "python-sdk legacy SSE server as a backend" "$venv/bin/python" tests/sdk/sse_backend.py "$bin"

# Two replicas sharing sessions through Redis behind a round-robin balancer (tests/sdk/balancer.py):
# each SDK's requests alternate between them, so a session made on one is rebuilt on the other.
scripts/redis.sh
redis_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no > "$work/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$redis_port" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
restored() { curl -fsS "${1%/mcp}/status" | python3 -c 'import json, sys; print(json.load(sys.stdin)["sessions"]["store"]["restored"])'; }
for mode in passthrough optimizer; do
  config="$work/$mode-replica.toml"
  gateway_config "$mode" "$(printf '[sessions]\nstore = "redis"\nredis_url = "redis://127.0.0.1:%s/0"' "$redis_port")" > "$config"
  replicas=()
  for r in a b; do
    "$bin" serve --config "$config" > "$work/replica-$r.out" 2> "$work/replica-$r.out.err" &
    pids+=($!)
    replicas+=($!)
    url=$(first_line "$work/replica-$r.out" "replica $r ($mode)" | grep -o 'http://[^ ]*')
    wait_ready "$url"
    if [ "$r" = a ]; then url_a=$url; else url_b=$url; fi
  done
  python3 tests/sdk/balancer.py "${url_a%/mcp}" "${url_b%/mcp}" > "$work/balancer.out" 2> "$work/balancer.out.err" &
  balancer=$!
  pids+=("$balancer")
  lb_url=$(first_line "$work/balancer.out" "the balancer")

  run "python-sdk (legacy) $mode through two replicas" "$venv/bin/python" tests/sdk/client.py "$mode" "$lb_url" --legacy
  run "python-sdk $mode through two replicas" "$venv/bin/python" tests/sdk/client.py "$mode" "$lb_url"
  run "typescript-sdk $mode through two replicas" node "$npm_prefix/client.mjs" "$mode" "$lb_url"
  moved=$(( $(restored "$url_a") + $(restored "$url_b") ))
  run "sessions rebuilt by the other replica ($mode)" test "$moved" -ge 2

  # Each replica and the balancer must have lived through it: one that ended says why here,
  # rather than ending this script at `kill` with no word.
  for r in a b balancer; do
    case $r in a) pid=${replicas[0]} ;; b) pid=${replicas[1]} ;; *) pid=$balancer ;; esac
    if ! kill -0 "$pid" 2>/dev/null; then
      failed=$((failed + 1))
      log="$work/replica-$r.out.err"; [ "$r" = balancer ] && log="$work/balancer.out.err"
      echo "sdk: $r ($mode) ended during the run; the end of its log:" >&2
      tail -30 "$log" >&2
    fi
  done
  kill "${replicas[@]}" "$balancer" 2>/dev/null || true
  wait "${replicas[@]}" "$balancer" 2>/dev/null || true
done

echo "sdk: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
