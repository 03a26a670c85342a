#!/usr/bin/env bash
# The project's shell scripts run on a Mac as well as on Linux: no GNU-only tool flags (BSD sed,
# readlink, stat, date and grep differ; coreutils' timeout is not there at all), and shellcheck
# clean. Installs shellcheck (Debian's package) if missing, where apt-get is.
set -euo pipefail
cd "$(dirname "$0")/.."
# (This file names the flags it looks for: it is not read for them.)
scripts=$(git ls-files '*.sh' .ci/run | grep -v '^scripts/check-portable.sh$')
status=0
# Each pattern, then (after a tab) what to use instead.
while IFS=$'\t' read -r pattern instead; do
  if hits=$(grep -nE "$pattern" $scripts | grep -vE '^[^:]+:[0-9]+:[[:space:]]*#'); then
    echo "portable: GNU-only '$pattern' ($instead):" >&2
    echo "$hits" >&2
    status=1
  fi
done <<PATTERNS
sed -i$(printf '\t')write to a temporary file and mv it
readlink -f$(printf '\t')cd "\$(dirname ...)" && pwd
(^|[;&|(][[:space:]]*)timeout [0-9]$(printf '\t')a loop with sleep, or the tool's own deadline
grep -[a-zA-Z]*P$(printf '\t')grep -E
stat -c$(printf '\t')wc -c < file, or ls
date \+%[0-9]*N$(printf '\t')date +%s
xargs -r$(printf '\t')test for empty input first
sort -V$(printf '\t')sort -n on the numeric field
PATTERNS
if ! command -v shellcheck >/dev/null && command -v apt-get >/dev/null; then
  as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends shellcheck >/dev/null \
    || { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends shellcheck >/dev/null; }
fi
if command -v shellcheck >/dev/null; then
  # Warnings and errors (style notes are left to taste); SC1091: sourced files are checked on
  # their own.
  shellcheck -x -S warning -e SC1091 $scripts scripts/check-portable.sh || status=1
else
  echo "portable: shellcheck is not installed; the GNU-flag check ran alone" >&2
fi
[ "$status" -eq 0 ] && echo "portable: $(echo "$scripts" | wc -w | tr -d ' ') scripts, no GNU-only flags, shellcheck clean"
exit "$status"
