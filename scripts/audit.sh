#!/usr/bin/env bash
# Audits Cargo.lock against the RustSec advisory database snapshot beside the project
# (../shared/advisory-db), offline. Installs the pinned cargo-audit into .tools when missing
# (a build of about 5 minutes on 2 cores, once per machine).
# Accepted advisories, each with its reason, are listed in docs/security.md and passed as --ignore.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
DB="${MODELGATE_ADVISORY_DB:-$REPO/../shared/advisory-db}"
CARGO_AUDIT_VERSION="0.22.2"

if [[ ! -d "$DB" ]]; then
  echo "audit: no advisory database at $DB (MODELGATE_ADVISORY_DB): the dependency audit cannot run" >&2
  exit 1
fi
if ! "$TOOLS/bin/cargo-audit" --version 2>/dev/null | grep -qx "cargo-audit-audit $CARGO_AUDIT_VERSION\|cargo-audit $CARGO_AUDIT_VERSION"; then
  echo "audit: installing cargo-audit $CARGO_AUDIT_VERSION into $TOOLS" >&2
  cargo install --locked --quiet --root "$TOOLS" cargo-audit --version "$CARGO_AUDIT_VERSION"
fi
# The database may be read-only (CI lays ../shared without write bits): audit a copy.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cp -r "$DB" "$WORK/advisory-db"
IGNORES=()
while read -r id _; do
  [[ -n "$id" ]] && IGNORES+=(--ignore "$id")
done < <(sed -n 's/^| *\(RUSTSEC-[0-9-]*\) *|.*/\1/p' "$REPO/docs/security.md" 2>/dev/null || true)
cd "$REPO"
"$TOOLS/bin/cargo-audit" audit --db "$WORK/advisory-db" --no-fetch --stale --deny warnings "${IGNORES[@]}"
