#!/usr/bin/env bash
# Runs toolmux in front of its built-in demo backends, fetching the model on first use.
# Extra arguments go to `toolmux demo` (e.g. --mode passthrough, --listen 127.0.0.1:0).
set -euo pipefail
cd "$(dirname "$0")/.."
models/fetch.sh all-MiniLM-L6-v2
# The `demo` profile builds in a little over half the time of `release` and runs find_tool as
# fast (Cargo.toml says what it gives up). `cargo run` finds the binary wherever
# CARGO_TARGET_DIR puts it.
exec cargo run --profile demo --locked --quiet -- demo "$@"
