#!/usr/bin/env bash
# The core crate (crates/modelgate-core) is the pure pipeline: bytes in, bytes out. This fails
# when any crate of I/O or of the command line is among its normal dependencies, direct or
# transitive, as cargo resolves them for the core alone.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

FORBIDDEN='tokio|tokio-rustls|axum|axum-core|hyper|hyper-util|h2|tower|kube-client|kube-runtime|clap|clap_builder|rustls|prometheus-client|tracing-subscriber'

deps="$(cargo tree --locked -p modelgate-core -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u)"
if [[ -z "$deps" ]]; then
  echo "cargo tree listed nothing for modelgate-core" >&2
  exit 1
fi
found="$(grep -xE "$FORBIDDEN" <<<"$deps" || true)"
if [[ -n "$found" ]]; then
  echo "modelgate-core must not depend on these (they belong to the modelgate package):" >&2
  while read -r name; do
    echo "  $name, through:" >&2
    cargo tree --locked -p modelgate-core -e normal --invert "$name" --depth 3 >&2 || true
  done <<<"$found"
  exit 1
fi
echo "modelgate-core: $(wc -l <<<"$deps") crates, none of: ${FORBIDDEN//|/, }"
