# shellcheck shell=bash
# Shell helpers shared by the scripts that drive real clients against the toolmux binary
# (tests/conformance/run.sh, tests/sdk/run.sh). Source it; it defines functions only.

# Prints the first line a background command writes to FILE (its URL), waiting up to 30 s.
# On a time-out prints what it wrote (FILE and FILE.err) and exits.
first_line() {
  for _ in $(seq 300); do
    [ -s "$1" ] && { head -1 "$1"; return; }
    sleep 0.1
  done
  echo "$0: $2 did not start; its output:" >&2; cat "$1" "$1.err" >&2 || true; exit 1
}

# Waits until the gateway at URL (…/mcp) answers /readyz with 200, up to 60 s.
wait_ready() {
  for _ in $(seq 600); do
    curl -fsS "${1%/mcp}/readyz" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "$0: the gateway at $1 did not become ready" >&2; exit 1
}
