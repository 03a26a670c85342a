#!/usr/bin/env bash
# Runs the official MCP conformance suite's server scenarios against toolmux (passthrough, bare
# names) in front of tests/conformance/backend.rs, prints each table, and fails on any failure not
# listed with a reason in tests/conformance/expected-failures-<version>.txt. Two lines of the
# suite run: the released 0.1 line and the 0.2 line with the 2026-07-28 scenarios, each against
# a backend that sends its requests to the client linked to their calls and one that does not.
#
# The 0.2 line's client scenarios run too, with toolmux as the client of the suite's mock servers
# and authorization servers (tests/conformance/client.py), against
# tests/conformance/expected-client-failures-<version>.txt.
#
# A suite passes only when it ran to its summary, every failure it reports is listed, its exit
# status agrees with what it reported (0 with no failure), and at least the number of scenarios
# below passed: a suite that crashes halfway or runs fewer scenarios fails the run.
#
# Usage: tests/conformance/run.sh [VERSION ...]   (default: every version below)
#
# Installs what it needs into a cache folder: each suite from npm and, where the machine's Node.js
# is older than 22, a Node 22 binary from the npm package node-linux-<arch>.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(0.1.16 0.2.0-alpha.12)
target="${CARGO_TARGET_DIR:-$root/target}"

case "$(uname -m)" in
  x86_64|amd64) node_arch=x64 ;;
  aarch64|arm64) node_arch=arm64 ;;
  *) echo "conformance: unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac
os=$(uname -s | tr '[:upper:]' '[:lower:]')

# Installs suite $1 (once) and prints its cache folder.
install_suite() {
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/toolmux/conformance-$1"
  if [ ! -x "$cache/node_modules/.bin/conformance" ]; then
    echo "conformance: installing @modelcontextprotocol/conformance@$1 into $cache" >&2
    mkdir -p "$cache"
    echo '{"private": true}' > "$cache/package.json"
    npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
      "@modelcontextprotocol/conformance@$1" "node-$os-$node_arch@22" >&2
  fi
  echo "$cache"
}

# The folder of a Node.js 22 or later: the machine's own, else the one installed with suite $1.
node_bin_for() {
  if command -v node >/dev/null && [ "$(node -p 'process.versions.node.split(".")[0]')" -ge 22 ]; then
    dirname "$(command -v node)"
  else
    echo "$1/node_modules/node-$os-$node_arch/bin"
  fi
}

cargo build --locked --bin toolmux --example conformance-backend
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

. tests/support.sh

# Starts the conformance backend (with the arguments given) and toolmux in front of it; sets
# backend_url and gateway_url.
start_gateway() {
  local dir
  dir=$(mktemp -d "$work/run.XXXX")
  "$target/debug/examples/conformance-backend" 127.0.0.1:0 "$@" > "$dir/backend.out" 2> "$dir/backend.out.err" &
  pids+=($!)
  backend_url=$(first_line "$dir/backend.out" backend)
  cat > "$dir/toolmux.toml" <<TOML
[server]
listen = "127.0.0.1:0"
mode = "passthrough"

[[backends]]
name = "conformance"
url = "$backend_url"

# The input-required scenarios, from a backend that speaks 2026-07-28 (tests/conformance/mrtr.rs).
[[backends]]
name = "conformance-mrtr"
url = "${backend_url%/mcp}/mrtr"
protocol = "2026-07-28"

[aggregation]
conflict_resolution = "priority"
TOML
  "$target/debug/toolmux" serve --config "$dir/toolmux.toml" > "$dir/toolmux.out" 2> "$dir/toolmux.out.err" &
  pids+=($!)
  gateway_url=$(first_line "$dir/toolmux.out" toolmux | grep -o 'http://[^ ]*')
  wait_ready "$gateway_url"
}

# The scenarios each suite must pass, at least ($1: server, per backend, or client; $2 the
# version). A function, not an associative array: macOS's bash 3.2 has none.
must_pass() {
  case "$1 $2" in
    "server 0.1.16") echo 32 ;;
    "server 0.2.0-alpha.12") echo 65 ;;
    "client 0.2.0-alpha.12") echo 42 ;;
    *) echo "conformance: no required count for the $1 suite $2; add one to must_pass" >&2; return 1 ;;
  esac
}

status=0

# Judges one suite's run: $1 its name in messages, $2 its summary (the scenario lines), $3 its
# exit status, $4 the expected-failures file, $5 how many scenarios must pass. Prints the verdict
# and sets status=1 when it fails.
judge() {
  local name=$1 summary=$2 exit_status=$3 expected_file=$4 must=$5
  local failed expected unexpected=() passed nfailed
  failed=$(grep -E '^✗ ' <<< "$summary" | sed -E 's/^✗ ([^:]+):.*/\1/' || true)
  expected=$(grep -vE '^\s*(#|$)' "$expected_file" | awk '{print $1}' || true)
  for f in $failed; do
    grep -qx "$f" <<< "$expected" || unexpected+=("$f")
  done
  if [ ${#unexpected[@]} -gt 0 ]; then
    echo "conformance: $name: unexpected failures: ${unexpected[*]}" >&2
    status=1
  fi
  # A listed failure that now passes is news too: the list must only name real gaps.
  for e in $expected; do
    grep -qx "$e" <<< "$failed" || echo "conformance: $name: $e passes now; remove it from $expected_file"
  done
  passed=$(grep -cE '^✓ ' <<< "$summary" || true)
  nfailed=$(grep -cE '^✗ ' <<< "$summary" || true)
  if [ "$passed" -lt "$must" ]; then
    echo "conformance: $name: only $passed scenarios pass, $must must" >&2
    status=1
  elif [ "$passed" -gt "$must" ]; then
    echo "conformance: $name: $passed scenarios pass, more than the $must this script requires; raise it"
  fi
  # The suite's exit status must say what its summary says: 0 exactly when nothing failed.
  if { [ "$nfailed" -eq 0 ] && [ "$exit_status" -ne 0 ]; } || { [ "$nfailed" -gt 0 ] && [ "$exit_status" -eq 0 ]; }; then
    echo "conformance: $name: the suite exited $exit_status with $nfailed failures in its summary" >&2
    status=1
  fi
  echo "conformance $name: $passed scenarios pass (at least $must required); $nfailed fail, each listed with its reason in $expected_file"
}

# Every suite twice: against a backend that ties its sampling and elicitation requests to the
# call that needs them, and against one that sends them unlinked, on its standalone stream (as
# the TypeScript SDK's example servers do), which toolmux must still route to the right client.
for backend in linked unlinked; do
if [ "$backend" = linked ]; then start_gateway; else start_gateway --unlinked; fi
for version in "${versions[@]}"; do
  cache=$(install_suite "$version")
  node_bin=$(node_bin_for "$cache")
  expected_file="tests/conformance/expected-failures-$version.txt"
  [ -f "$expected_file" ] || { echo "conformance: no $expected_file" >&2; exit 1; }
  echo "conformance: suite $version against $gateway_url ($backend backend $backend_url)"
  set +e
  PATH="$node_bin:$PATH" "$cache/node_modules/.bin/conformance" server --url "$gateway_url" --suite all \
    > "$work/suite.out" 2>&1
  suite_status=$?
  set -e
  # The suite's own total counts checks, failed ones of listed scenarios included: the verdict
  # is the line below, per scenario and against the list.
  sed -n '/=== SUMMARY ===/,$p' "$work/suite.out" | grep -v '^Total:'
  if ! grep -q '=== SUMMARY ===' "$work/suite.out"; then
    echo "conformance: suite $version did not run to its summary (exit $suite_status):" >&2
    tail -40 "$work/suite.out" >&2
    status=1
    continue
  fi
  must=$(must_pass server "$version")
  judge "$version ($backend backend)" "$(sed -n '/=== SUMMARY ===/,$p' "$work/suite.out")" "$suite_status" \
    "$expected_file" "$must"
done
done

# The client scenarios of the 0.2 line, with toolmux as the client: the suite runs
# tests/conformance/client.py with each mock server's URL, which puts toolmux in front of it
# (logging in first where the scenario is an authorization one) and drives it as an MCP client.
client_versions=()
for v in "${versions[@]}"; do [[ "$v" == 0.2.* ]] && client_versions+=("$v"); done
for version in "${client_versions[@]}"; do
  cache=$(install_suite "$version")
  node_bin=$(node_bin_for "$cache")
  expected_file="tests/conformance/expected-client-failures-$version.txt"
  [ -f "$expected_file" ] || { echo "conformance: no $expected_file" >&2; exit 1; }
  echo "conformance: client scenarios of suite $version, toolmux as the client"
  set +e
  PATH="$node_bin:$PATH" "$cache/node_modules/.bin/conformance" client --suite all \
    --command "python3 $root/tests/conformance/client.py $target/debug/toolmux" > "$work/client-suite.out" 2>&1
  client_status=$?
  set -e
  summary=$(sed -n '/=== SUITE SUMMARY ===/,$p' "$work/client-suite.out" | sed "s/$(printf '\033')\\[[0-9;]*m//g")
  if [ -z "$summary" ]; then
    echo "conformance: the client suite $version did not run to its summary:" >&2
    tail -40 "$work/client-suite.out" >&2
    status=1
    continue
  fi
  grep -v '^Total:' <<< "$summary"
  must=$(must_pass client "$version")
  judge "$version (client scenarios)" "$summary" "$client_status" "$expected_file" "$must"
done
exit $status
