#!/usr/bin/env bash
# Installs Chromium and chromedriver if they are not on PATH (Debian's chromium and
# chromium-driver packages): the console's browser test (tests/it/console.rs) drives them over
# WebDriver. Runs as root, or with sudo available, for apt-get; does nothing when installed.
# On a Mac, Homebrew's chromedriver and a Chromium (or Google Chrome) on PATH do the same job.
set -euo pipefail
have() { command -v "$1" >/dev/null; }
if have chromedriver && { have chromium || have chromium-browser; }; then
  exit 0
fi
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if ! have apt-get && have brew; then
  echo "chromium.sh: installing chromium and chromedriver (Homebrew)"
  brew install --quiet --cask chromium chromedriver
  exit 0
fi
have apt-get || {
  echo "chromium.sh: chromium and chromedriver are not installed, and neither apt-get nor Homebrew is here: install both" >&2
  exit 1
}
echo "chromium.sh: installing chromium and chromium-driver"
as_root apt-get update -qq
as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  chromium chromium-driver fonts-dejavu-core >/dev/null
have chromedriver
