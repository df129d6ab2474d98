#!/usr/bin/env bash
# Exploratory fuzzing: a separate command with its own time budget, not part of scripts/test.sh
# (which replays the kept corpora and every regression input deterministically, through
# tests/fuzz_regressions.rs).
#
#   scripts/fuzz.sh [target...]                 # explore: each target (default: all) for
#                                               # MODELGATE_FUZZ_SECONDS (default 60)
#   scripts/fuzz.sh reproduce <target> <file>   # run one input (a crash artifact) again
#   scripts/fuzz.sh minimize <target> <file>    # shrink a crash artifact (cargo fuzz tmin)
#
# Exploring starts from the kept corpus in fuzz/corpus/<target>/ and works on a scratch copy;
# with MODELGATE_FUZZ_MERGE=1 the inputs that add coverage are merged back into the kept corpus
# afterwards (libFuzzer -merge=1). A crash, panic, timeout or memory blow-up fails the run and
# leaves the input in fuzz/artifacts/<target>/; the script then prints how to reproduce and
# minimise it with this script, and where to keep it as a regression (fuzz/regressions/<target>/).
#
# Only the stable toolchain is assumed: RUSTC_BOOTSTRAP=1 lets it accept the -Z flags cargo-fuzz
# passes, and `-s none` builds without a sanitizer (safe Rust; libFuzzer still catches panics,
# timeouts and RSS/malloc limits). Installs the pinned cargo-fuzz into .tools
# (MODELGATE_TOOLS_DIR) when missing.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
CARGO_FUZZ_VERSION="0.13.2"
SECONDS_PER_TARGET="${MODELGATE_FUZZ_SECONDS:-60}"
ALL_TARGETS=(review read_documents)
LIMITS=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=65536)

usage() { sed -n '6,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

known_target() {
  local t
  for t in "${ALL_TARGETS[@]}"; do [[ "$1" == "$t" ]] && return 0; done
  echo "fuzz: unknown target '$1' (targets: ${ALL_TARGETS[*]})" >&2
  exit 2
}

# The pinned cargo-fuzz, installed on first use.
cargo_fuzz() {
  if ! "$TOOLS/bin/cargo-fuzz" --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
    echo "fuzz: installing cargo-fuzz $CARGO_FUZZ_VERSION into $TOOLS" >&2
    cargo install --locked --quiet --root "$TOOLS" cargo-fuzz --version "$CARGO_FUZZ_VERSION"
  fi
  RUSTC_BOOTSTRAP=1 "$TOOLS/bin/cargo-fuzz" "$@"
}

case "${1:-}" in
  reproduce | minimize)
    [[ $# -eq 3 ]] || usage
    known_target "$2"
    input="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
    cd "$REPO/fuzz"
    if [[ "$1" == reproduce ]]; then
      cargo_fuzz run -s none --release "$2" "$input" -- "${LIMITS[@]}"
    else
      cargo_fuzz tmin -s none --release "$2" "$input" -- "${LIMITS[@]}"
    fi
    exit
    ;;
  -h | --help) usage ;;
esac

TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=("${ALL_TARGETS[@]}")
for target in "${TARGETS[@]}"; do known_target "$target"; done

cd "$REPO/fuzz"
scratch=""
trap '[[ -z "$scratch" ]] || rm -rf "$scratch"' EXIT
for target in "${TARGETS[@]}"; do
  scratch="$(mktemp -d)"
  cp -r "corpus/$target/." "$scratch/" 2>/dev/null || true
  echo "==> fuzz $target for ${SECONDS_PER_TARGET}s" >&2
  if ! cargo_fuzz run -s none --release "$target" "$scratch" -- \
    -max_total_time="$SECONDS_PER_TARGET" "${LIMITS[@]}" -print_final_stats=1; then
    # shellcheck disable=SC2012 # libFuzzer names artifacts crash-<sha1> and the like
    artifact="$(ls -t "artifacts/$target"/* 2>/dev/null | head -n 1 || true)"
    cat >&2 <<EOF

fuzz: $target failed${artifact:+ on fuzz/$artifact}. With the project's script:
  reproduce:  scripts/fuzz.sh reproduce $target fuzz/${artifact:-artifacts/$target/<file>}
  minimise:   scripts/fuzz.sh minimize $target fuzz/${artifact:-artifacts/$target/<file>}
  keep it:    copy the (minimised) input to fuzz/regressions/$target/; cargo test --test
              fuzz_regressions replays it on every test run (scripts/test.sh).
EOF
    exit 1
  fi
  if [[ "${MODELGATE_FUZZ_MERGE:-0}" == "1" ]]; then
    echo "==> merge new coverage of $target into fuzz/corpus/$target" >&2
    mkdir -p "corpus/$target"
    cargo_fuzz run -s none --release "$target" "corpus/$target" "$scratch" -- -merge=1 "${LIMITS[@]}"
  fi
  rm -rf "$scratch"
  scratch=""
done
