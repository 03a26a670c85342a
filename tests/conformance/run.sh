#!/usr/bin/env bash
# Runs the official MCP conformance suite's server scenarios against toolmux (passthrough, bare
# names) in front of tests/conformance/backend.rs, prints the table, and fails on any failure not
# listed with a reason in tests/conformance/expected-failures.txt.
#
# Installs what it needs into a cache folder: the suite from npm and, where the machine's Node.js
# is older than 22, a Node 22 binary from the npm package node-linux-<arch>.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
suite_version=0.1.16
cache="${XDG_CACHE_HOME:-$HOME/.cache}/toolmux/conformance-$suite_version"
target="${CARGO_TARGET_DIR:-$root/target}"

case "$(uname -m)" in
  x86_64|amd64) node_arch=x64 ;;
  aarch64|arm64) node_arch=arm64 ;;
  *) echo "conformance: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
os=$(uname -s | tr '[:upper:]' '[:lower:]')

if [ ! -x "$cache/node_modules/.bin/conformance" ]; then
  echo "conformance: installing @modelcontextprotocol/conformance@$suite_version into $cache"
  mkdir -p "$cache"
  echo '{"private": true}' > "$cache/package.json"
  npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
    "@modelcontextprotocol/conformance@$suite_version" "node-$os-$node_arch@22"
fi
node_bin="$cache/node_modules/node-$os-$node_arch/bin"
if command -v node >/dev/null && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 22 ]; then
  node_bin=$(dirname "$(command -v node)")
fi
export PATH="$node_bin:$PATH"

cargo build --locked --bin toolmux --example conformance-backend
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

. tests/support.sh

"$target/debug/examples/conformance-backend" 127.0.0.1:0 > "$work/backend.out" 2> "$work/backend.out.err" &
pids+=($!)
backend_url=$(first_line "$work/backend.out" backend)

cat > "$work/toolmux.toml" <<TOML
[server]
listen = "127.0.0.1:0"
mode = "passthrough"

[[backends]]
name = "conformance"
url = "$backend_url"

[aggregation]
conflict_resolution = "priority"
TOML
"$target/debug/toolmux" serve --config "$work/toolmux.toml" > "$work/toolmux.out" 2> "$work/toolmux.out.err" &
pids+=($!)
gateway_url=$(first_line "$work/toolmux.out" toolmux | grep -o 'http://[^ ]*')
wait_ready "$gateway_url"

echo "conformance: suite $suite_version against $gateway_url (backend $backend_url)"
set +e
"$cache/node_modules/.bin/conformance" server --url "$gateway_url" --suite all > "$work/suite.out" 2>&1
suite_status=$?
set -e
sed -n '/=== SUMMARY ===/,$p' "$work/suite.out"

failed=$(grep -E '^✗ ' "$work/suite.out" | sed -E 's/^✗ ([^:]+):.*/\1/' || true)
expected=$(grep -vE '^\s*(#|$)' tests/conformance/expected-failures.txt | awk '{print $1}' || true)
unexpected=()
for f in $failed; do
  grep -qx "$f" <<< "$expected" || unexpected+=("$f")
done
if ! grep -q '=== SUMMARY ===' "$work/suite.out"; then
  echo "conformance: the suite did not run to its summary (exit $suite_status):" >&2
  tail -40 "$work/suite.out" >&2
  exit 1
fi
if [ ${#unexpected[@]} -gt 0 ]; then
  echo "conformance: unexpected failures: ${unexpected[*]}" >&2
  for f in "${unexpected[@]}"; do
    awk -v s="=== Running scenario: $f ===" '$0==s{p=1} p&&/^=== Running scenario/&&$0!=s{p=0} p' "$work/suite.out" | head -40 >&2
  done
  exit 1
fi
passed=$(grep -cE '^✓ ' "$work/suite.out" || true)
nfailed=$(grep -cE '^✗ ' "$work/suite.out" || true)
echo "conformance: $passed passed, $nfailed failed"
