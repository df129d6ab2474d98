#!/usr/bin/env bash
# Builds the release binaries: modelgate for linux amd64 and arm64, static (musl), with a
# SHA256SUMS file beside them. The release workflow (.github/workflows/release.yml) runs it on a
# tag; tests/assets/test_release.py runs its --check.
#
#   scripts/release-binaries.sh [--check] [--out DIR] [--tag vVERSION] [--target TRIPLE]...
#   scripts/release-binaries.sh --out dist --tag v0.1.0
#
# Cross-compiles with cargo-zigbuild and Zig (pinned below, from PyPI, into
# $MODELGATE_TOOLS_DIR/release-venv) after `rustup target add` of each target: no C toolchain for
# the targets is needed. The binaries carry the commit (MODELGATE_COMMIT, read by build.rs) of
# the checkout. Outputs, in DIR (default target/release-binaries):
#   modelgate-VERSION-linux-amd64   (x86_64-unknown-linux-musl)
#   modelgate-VERSION-linux-arm64   (aarch64-unknown-linux-musl)
#   SHA256SUMS                      (`sha256sum -c SHA256SUMS` checks them)
# --tag refuses a tag that is not v + the crate's version. --check checks the arguments and the
# version, and prints what would be built ("TARGET<TAB>PATH" lines, then the SHA256SUMS path) and
# builds nothing: it needs neither rustup nor the musl targets.
# Exit 2 for bad arguments, 1 for any other failure.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"

# --- pins -------------------------------------------------------------------------------------
# Wheels for Linux x86_64 (any CPython 3): the release runs on x86_64 and cross-compiles.
RELEASE_REQUIREMENTS=(
  "cargo-zigbuild==0.24.1 --hash=sha256:238a1ab54a95053a4eadc34775c81f795a8ad75f80bfed63f3f445f518102375"
  "ziglang==0.15.2 --hash=sha256:806316453d1ede7174ed3fefb8e5348154629089c3bb5fe812dfd0e172fac130"
)
# target triple -> the os-arch suffix of the binary's name
declare -A ARCH=(
  [x86_64-unknown-linux-musl]=linux-amd64
  [aarch64-unknown-linux-musl]=linux-arm64
)
DEFAULT_TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
# ------------------------------------------------------------------------------------------------

usage() {
  sed -n '6,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
log() { printf 'release-binaries: %s\n' "$*" >&2; }
die() {
  log "$*"
  exit 1
}

check=0
out="$REPO/target/release-binaries"
tag=""
targets=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --check) check=1 ;;
    --out | --tag | --target)
      [[ $# -ge 2 && -n "$2" ]] || usage
      case "$1" in
        --out) out="$2" ;;
        --tag) tag="$2" ;;
        --target)
          if [[ -z "${ARCH[$2]:-}" ]]; then
            log "unknown target $2 (one of: ${DEFAULT_TARGETS[*]})"
            exit 2
          fi
          targets+=("$2")
          ;;
      esac
      shift
      ;;
    -h | --help) usage ;;
    *)
      log "unknown argument $1"
      usage
      ;;
  esac
  shift
done
[[ ${#targets[@]} -gt 0 ]] || targets=("${DEFAULT_TARGETS[@]}")

version="$(awk -F'"' '/^\[/ { section = $0 } section == "[package]" && /^version *=/ { print $2; exit }' "$REPO/Cargo.toml")"
[[ -n "$version" ]] || die "no version in Cargo.toml's [package]"
if [[ -n "$tag" && "$tag" != "v$version" ]]; then
  die "tag $tag is not v$version, the version in Cargo.toml: bump Cargo.toml and Chart.yaml first (docs/releasing.md)"
fi

out="$(realpath -m "$out")"
plan() {
  local t
  for t in "${targets[@]}"; do printf '%s\t%s\n' "$t" "$out/modelgate-$version-${ARCH[$t]}"; done
  printf 'SHA256SUMS\t%s\n' "$out/SHA256SUMS"
}

if [[ $check == 1 ]]; then
  log "check: modelgate $version${tag:+ (tag $tag)}: would build ${targets[*]} into $out"
  plan
  exit 0
fi

for tool in cargo rustup python3 sha256sum git; do
  command -v "$tool" >/dev/null || die "'$tool' is required"
done

# cargo-zigbuild and Zig, pinned by hash, in their own venv (stamped with the pins).
venv="$TOOLS/release-venv"
stamp="$(printf '%s\n' "${RELEASE_REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)"
if [[ "$(cat "$venv/.modelgate-requirements" 2>/dev/null)" != "$stamp" ]]; then
  log "installing cargo-zigbuild and ziglang into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "python3 -m venv failed"
  printf '%s\n' "${RELEASE_REQUIREMENTS[@]}" >"$venv/requirements.txt"
  "$venv/bin/python" -m pip install --quiet --no-deps --require-hashes -r "$venv/requirements.txt" \
    || die "pip install failed"
  echo "$stamp" >"$venv/.modelgate-requirements"
fi
export PATH="$venv/bin:$PATH" # cargo-zigbuild, and the python3 whose `-m ziglang` is Zig

rustup target add "${targets[@]}" >&2

cd "$REPO"
# What build.rs stamps into `modelgate --version` (set by the caller, else this checkout's).
export MODELGATE_COMMIT="${MODELGATE_COMMIT:-$(git rev-parse HEAD)}"
export MODELGATE_COMMIT_DATE="${MODELGATE_COMMIT_DATE:-$(git log -1 --format=%cs HEAD)}"
expected="modelgate $version (commit ${MODELGATE_COMMIT:0:12}, $MODELGATE_COMMIT_DATE)"

# An ELF file with no PT_INTERP program header is statically linked.
is_static() {
  python3 - "$1" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
assert data[:4] == b"\x7fELF" and data[4] == 2, "not a 64-bit ELF file"
end = "<" if data[5] == 1 else ">"
phoff, = struct.unpack_from(end + "Q", data, 0x20)
phentsize, phnum = struct.unpack_from(end + "HH", data, 0x36)
types = [struct.unpack_from(end + "I", data, phoff + i * phentsize)[0] for i in range(phnum)]
sys.exit(3 in types)  # PT_INTERP
PY
}

mkdir -p "$out"
rm -f "$out/SHA256SUMS"
names=()
while IFS=$'\t' read -r target path; do
  [[ "$target" == SHA256SUMS ]] && continue
  log "building $target"
  cargo zigbuild --release --locked --bin modelgate --target "$target" >&2
  install -m 0755 "${CARGO_TARGET_DIR:-target}/$target/release/modelgate" "$path"
  is_static "$path" || die "$path is not statically linked"
  if [[ "$target" == "$(uname -m)-unknown-linux-musl" ]]; then
    [[ "$("$path" --version)" == "$expected" ]] || die "$path --version says '$("$path" --version)', not '$expected'"
  fi
  names+=("$(basename "$path")")
done < <(plan)
(cd "$out" && sha256sum "${names[@]}" >SHA256SUMS)
log "built $expected for ${targets[*]}:"
cat "$out/SHA256SUMS" >&2
plan
