#!/usr/bin/env bash
# toolmux on aarch64, checked from an x86-64 Debian machine: cross-builds the library's unit tests,
# the integration tests and the binary for aarch64-unknown-linux-gnu with Debian's Rust toolchain
# (rustup's has no aarch64 standard library here), then runs under qemu-user on three CPU models:
# a baseline ARMv8.0 core (cortex-a72: NEON, no dot product), a modern one (neoverse-n1: with the
# dot-product extension) and qemu's `max` (every extension qemu knows, int8 matrix multiply
# among them):
#   - every unit test, the SIMD kernels' and the index's checks against their exact oracles
#     among them (the int8 encoder's SDOT outer product on the second, SMMLA on the third), and a check that
#     the expected vector path and int8 kernel run on each CPU model;
#   - the golden-vector tests (every text of tests/fixtures against sentence-transformers'
#     vectors, batch and single: cosine >= 0.999 in f32, >= 0.995 with the int8 encoder);
#   - an end-to-end smoke test: the gateway as a child process in optimizer mode over a small
#     catalog, find_tool ranking a known tool first, call_tool running one.
#
# Usage: scripts/test-arm64.sh            cross-build every target and run the checks under qemu
#        scripts/test-arm64.sh --build    install what is needed and cross-build every target only,
#                                         mostly unoptimised (what CI runs: it proves the build, not speed)
#
# Installs what it needs with apt (run as root, or with sudo available), idempotently.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
only_build=false
[ "${1:-}" = "--build" ] && only_build=true

triple=aarch64-unknown-linux-gnu
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# 1. Debian's compiler with an aarch64 standard library, the cross linker, and qemu-user.
packages=(rustc-web cargo-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "arm64: installing ${missing[*]}"
  dpkg --print-foreign-architectures | grep -qx arm64 || as_root dpkg --add-architecture arm64
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Cross-build, in a target folder of its own (another compiler, another target).
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_ARM64:-${XDG_CACHE_HOME:-$HOME/.cache}/toolmux/target-aarch64}"
cargo=/usr/bin/cargo
# Only building proves what CI needs (nothing x86-only, every aarch64 kernel through LLVM's code
# generation), and that needs no fast code: with --build, everything but gemm's half-precision
# code compiles at opt-level 0, which takes far less time than the optimised dependencies do
# cold. That code's assembly only assembles once inlined into its `fp16` functions, so
# gemm-common and gemm-f16 keep their optimisation. Running under qemu needs the real profile.
profile=()
if $only_build; then
  profile=(--config 'profile.dev.package."*".opt-level = 0' --config 'profile.dev.package.toolmux.opt-level = 0'
           --config 'profile.dev.package.gemm-common.opt-level = 3' --config 'profile.dev.package.gemm-f16.opt-level = 3')
fi
start=$(date +%s)
$cargo test --locked --target $triple --no-run --all-targets ${profile[@]+"${profile[@]}"}
echo "arm64: cross-built in $(( $(date +%s) - start )) s"
$only_build && exit 0

# 3. qemu-user for aarch64 binaries, registered for child processes too (tests start toolmux).
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  as_root mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
  # Without -L: with it, every program hangs at its first thread start.
  as_root sh -c 'cat /usr/lib/binfmt.d/qemu-aarch64.conf > /proc/sys/fs/binfmt_misc/register'
fi

# The test binaries, as cargo names them: the test harness artifacts of the library and of `it`.
test_binary() {
  $cargo test --locked --target $triple --no-run "$@" --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])
        break'
}
lib_tests=$(test_binary --lib)
it_tests=$(test_binary --test it)
[ -x "$lib_tests" ] && [ -x "$it_tests" ] || { echo "arm64: test binaries not found" >&2; exit 1; }
# ELF e_machine (bytes 18-19) is 0xb7 for aarch64.
[ "$(od -An -tx1 -j18 -N2 "$lib_tests" | tr -d ' \n')" = "b700" ] || { echo "arm64: $lib_tests is not an aarch64 binary" >&2; exit 1; }

models/fetch.sh all-MiniLM-L6-v2
export TOOLMUX_MODELS_DIR="$root/models"
status=0
cpus=(cortex-a72 neoverse-n1 max)
for cpu in "${cpus[@]}"; do
  case $cpu in
    cortex-a72) expected="aarch64 neon" kernel=rows ;;
    neoverse-n1) expected="aarch64 neon+dotprod" kernel=sdot ;;
    max) expected="aarch64 neon+dotprod" kernel=i8mm ;;
  esac
  # A fresh temporary folder: no vectors cached by an x86-64 run, so the aarch64 build embeds.
  scratch=$(mktemp -d)
  echo "arm64: $cpu: unit tests"
  t0=$(date +%s)
  if ! QEMU_CPU=$cpu TMPDIR=$scratch "$lib_tests" --test-threads 2 --nocapture > "$scratch/unit.log" 2>&1; then
    tail -40 "$scratch/unit.log"; status=1
  fi
  grep -E '^test result' "$scratch/unit.log" || true
  path=$(sed -n 's/^simd path: //p' "$scratch/unit.log")
  if [ "$path" != "$expected" ]; then
    echo "arm64: $cpu ran the vector path '$path', expected '$expected'" >&2; status=1
  else
    echo "arm64: $cpu runs the vector path '$path'"
  fi
  ran=$(sed -n 's/^int8 kernel: //p' "$scratch/unit.log")
  if [ "$ran" != "$kernel" ]; then
    echo "arm64: $cpu chose the int8 kernel '$ran', expected '$kernel'" >&2; status=1
  else
    echo "arm64: $cpu runs the int8 kernel '$ran'"
  fi
  echo "arm64: $cpu: golden vectors and the end-to-end smoke test"
  if ! QEMU_CPU=$cpu TMPDIR=$scratch "$it_tests" --test-threads 1 --nocapture \
      search::embeddings_match_sentence_transformers search::int8_embeddings_stay_close_to_sentence_transformers \
      cli::smoke_optimizer_over_stdio_finds_and_calls \
      > "$scratch/it.log" 2>&1; then
    tail -40 "$scratch/it.log"; status=1
  fi
  grep -oE 'golden vectors(, int8)?: .*|^test result.*' "$scratch/it.log" || true
  echo "arm64: $cpu took $(( $(date +%s) - t0 )) s"
  rm -rf "$scratch"
done
[ $status -eq 0 ] && echo "arm64: all checks passed on ${cpus[*]}"
exit $status
