#!/usr/bin/env bash
# Installs redis-server if it is not on PATH (Debian's package, or Homebrew's on a Mac): the
# replica tests (tests/it/replicas/) and the session-store benchmark (benches/replicas.rs)
# start their own on 127.0.0.1 at a free port. Runs as root, or with sudo available, for apt-get;
# does nothing when installed.
set -euo pipefail
command -v redis-server >/dev/null && exit 0
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v apt-get >/dev/null && command -v brew >/dev/null; then
  echo "redis.sh: installing redis (Homebrew)"
  brew install --quiet redis
  command -v redis-server >/dev/null
  exit 0
fi
command -v apt-get >/dev/null || {
  echo "redis.sh: redis-server is not installed, and neither apt-get nor Homebrew is here: install Redis 6 or later" >&2
  exit 1
}
echo "redis.sh: installing redis-server"
as_root apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null
# The package starts a system service where there is an init system; the tests start their own.
command -v redis-server >/dev/null
