#!/usr/bin/env bash
# Audits Cargo.lock against the RustSec advisory database: the pinned snapshot that
# scripts/inputs.sh resolves into .inputs/advisory-db (tests/inputs.json, docs/test-inputs.md),
# offline; or, where no mirror had it, the database cargo-audit fetches itself (its newest
# commit: that audit is not pinned). MODELGATE_ADVISORY_DB names another database, used offline.
# Installs the pinned cargo-audit into .tools when missing (a build of about 5 minutes on 2
# cores, once per machine).
# Accepted advisories, each with its reason, are listed in docs/security.md and passed as --ignore.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
INPUTS="${MODELGATE_INPUTS_DIR:-.inputs}"
[[ "$INPUTS" == /* ]] || INPUTS="$REPO/$INPUTS"
CARGO_AUDIT_VERSION="0.22.2"

FETCH=()
if [[ -n "${MODELGATE_ADVISORY_DB:-}" ]]; then
  DB="$MODELGATE_ADVISORY_DB"
  if [[ ! -d "$DB" ]]; then
    echo "audit: no advisory database at $DB (MODELGATE_ADVISORY_DB): the dependency audit cannot run" >&2
    exit 1
  fi
else
  "$REPO/scripts/inputs.sh" --quiet advisory-db
  if [[ -d "$INPUTS/advisory-db" ]]; then
    DB="$INPUTS/advisory-db"
  else
    # No mirror had it (.inputs/advisory-db.fetch says so): cargo-audit fetches it here.
    DB=""
    FETCH=(--db "$INPUTS/advisory-db.fetched")
  fi
fi
if ! "$TOOLS/bin/cargo-audit" --version 2>/dev/null | grep -qx "cargo-audit-audit $CARGO_AUDIT_VERSION\|cargo-audit $CARGO_AUDIT_VERSION"; then
  echo "audit: installing cargo-audit $CARGO_AUDIT_VERSION into $TOOLS" >&2
  cargo install --locked --quiet --root "$TOOLS" cargo-audit --version "$CARGO_AUDIT_VERSION"
fi
# cargo-audit may write into the database it reads (a mirror may be read-only): audit a copy.
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
[[ -z "$DB" ]] || cp -r "$DB" "$WORK/advisory-db"
IGNORES=()
while read -r id _; do
  [[ -n "$id" ]] && IGNORES+=(--ignore "$id")
done < <(sed -n 's/^| *\(RUSTSEC-[0-9-]*\) *|.*/\1/p' "$REPO/docs/security.md" 2>/dev/null || true)
cd "$REPO"
if [[ -n "$DB" ]]; then
  "$TOOLS/bin/cargo-audit" audit --db "$WORK/advisory-db" --no-fetch --stale --deny warnings "${IGNORES[@]}"
else
  echo "audit: no pinned advisory database: cargo-audit fetches the newest one (${FETCH[1]})" >&2
  "$TOOLS/bin/cargo-audit" audit "${FETCH[@]}" --deny warnings "${IGNORES[@]}"
fi
