#!/usr/bin/env bash
# Runs each cargo-fuzz target of fuzz/ for a bounded time (MODELGATE_FUZZ_SECONDS, default 60),
# starting from the kept corpus in fuzz/corpus/<target>/ (new finds go to a scratch copy, not into
# the repository). Fails on any crash, panic, timeout or memory blow-up; the reproducer is left in
# fuzz/artifacts/<target>/.
#
# Only the stable toolchain is available: RUSTC_BOOTSTRAP=1 lets it accept the -Z flags
# cargo-fuzz passes, and `-s none` builds without a sanitizer (safe Rust; libFuzzer still catches
# panics, timeouts and RSS/malloc limits). Installs the pinned cargo-fuzz into .tools when missing.
#
#   scripts/fuzz.sh                       # both targets, 60 s each
#   MODELGATE_FUZZ_SECONDS=600 scripts/fuzz.sh review
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
CARGO_FUZZ_VERSION="0.13.2"
SECONDS_PER_TARGET="${MODELGATE_FUZZ_SECONDS:-60}"
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(review read_documents)

if ! "$TOOLS/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
  echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION into $TOOLS" >&2
  cargo install --locked --quiet --root "$TOOLS" cargo-fuzz --version "$CARGO_FUZZ_VERSION"
fi
export RUSTC_BOOTSTRAP=1
cd "$REPO/fuzz"
for target in "${TARGETS[@]}"; do
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  cp -r "corpus/$target/." "$scratch/" 2>/dev/null || true
  echo "==> fuzz $target for ${SECONDS_PER_TARGET}s" >&2
  "$TOOLS/bin/cargo-fuzz" run -s none --release "$target" "$scratch" -- \
    -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -max_len=65536 -print_final_stats=1
  rm -rf "$scratch"
done
