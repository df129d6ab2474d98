#!/usr/bin/env bash
# Checks the install assets (charts/modelgate, manifests/, Dockerfile, the monitoring objects)
# with the tools of the ecosystem: the tests are tests/assets (pytest), which call helm, kubectl
# kustomize, kubernetes-validate, hadolint, openssl, promtool and a real Prometheus scraping
# `modelgate serve`. This script only installs the pinned tools (scripts/install-tools.sh, into
# .tools/), lints the tests (ruff) and runs them. Extra arguments go to pytest:
#
#   scripts/check-install-assets.sh                  everything
#   scripts/check-install-assets.sh -k monitoring    only tests whose name matches
#
# The tests against the binary use target/debug/modelgate (scripts/test.sh builds it with
# `cargo test` first) or MODELGATE_BIN; the corpus and kube-apiserver's CEL (the kube-cel binaries
# that evaluate the webhooks' matchConditions) are inputs that scripts/inputs.sh resolves
# (.inputs/corpus, .inputs/kube-cel; MODELGATE_CORPUS, MODELGATE_KUBE_CEL_DIR name others).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
needed=()
[[ -n "${MODELGATE_CORPUS:-}" ]] || needed+=(corpus)
[[ -n "${MODELGATE_KUBE_CEL_DIR:-}" ]] || needed+=(kube-cel)
[[ ${#needed[@]} -eq 0 ]] || "$REPO/scripts/inputs.sh" --quiet "${needed[@]}"
"$REPO/scripts/install-tools.sh"
BIN="${MODELGATE_TOOLS_DIR:-$REPO/.tools}/bin"
export MODELGATE_TOOLS_DIR="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
TESTS="$REPO/tests/assets"

echo "== ruff check, ruff format --check (tests/assets)"
"$BIN/ruff" check --no-cache --config "$TESTS/pyproject.toml" "$TESTS"
"$BIN/ruff" format --no-cache --check --config "$TESTS/pyproject.toml" "$TESTS"

echo "== pytest tests/assets"
cd "$TESTS"
exec "$MODELGATE_TOOLS_DIR/venv/bin/python" -m pytest -p no:cacheprovider -v "$@"
