#!/usr/bin/env bash
# Packages the Helm chart (charts/modelgate) into DIR/modelgate-VERSION.tgz and, with --push,
# pushes it to an OCI registry. The release workflow (.github/workflows/release.yml) runs it;
# tests/assets/test_release.py runs it into a temporary directory.
#
#   scripts/package-chart.sh [--out DIR] [--image-repository REPO] [--push oci://REGISTRY/PATH]
#   scripts/package-chart.sh --out dist --image-repository ghcr.io/acme/modelgate --push oci://ghcr.io/acme/charts
#
# The chart's version and appVersion must both be the crate's version (Cargo.toml [package]):
# nothing is packaged otherwise. --image-repository writes image.repository into the packaged
# chart's values.yaml (the chart in the tree is left alone; the image tag stays the chart's
# appVersion). --push needs `helm registry login REGISTRY` first. helm is $HELM, else the pinned
# one of scripts/install-tools.sh ($MODELGATE_TOOLS_DIR/bin/helm, default .tools/bin/helm).
# Prints the package's path on stdout; exit 2 for bad arguments, 1 for any other failure.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
HELM="${HELM:-$TOOLS/bin/helm}"
CHART="$REPO/charts/modelgate"

usage() {
  sed -n '6,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() {
  printf 'package-chart: %s\n' "$*" >&2
  exit 1
}

out="$REPO/target/chart"
image_repository=""
push=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out | --image-repository | --push)
      [[ $# -ge 2 && -n "$2" ]] || usage
      case "$1" in
        --out) out="$2" ;;
        --image-repository) image_repository="$2" ;;
        --push) push="$2" ;;
      esac
      shift
      ;;
    -h | --help) usage ;;
    *)
      echo "package-chart: unknown argument $1" >&2
      usage
      ;;
  esac
  shift
done
if [[ -n "$push" && "$push" != oci://* ]]; then
  echo "package-chart: --push takes an oci:// reference, not '$push'" >&2
  exit 2
fi
# A registry/path[:port] reference, nothing YAML could read as anything else.
if [[ -n "$image_repository" && ! "$image_repository" =~ ^[a-z0-9]+([._:/-][a-z0-9]+)*$ ]]; then
  echo "package-chart: --image-repository '$image_repository' is not an image repository (lowercase registry/path)" >&2
  exit 2
fi
[[ -x "$HELM" ]] || die "no helm at $HELM (scripts/install-tools.sh installs it, or set HELM)"

# The crate's version: the first `version = "..."` of Cargo.toml's [package] table.
crate_version="$(awk -F'"' '/^\[/ { section = $0 } section == "[package]" && /^version *=/ { print $2; exit }' "$REPO/Cargo.toml")"
chart_field() { awk -v key="$1:" '$1 == key { v = $2; gsub(/["'\'']/, "", v); print v; exit }' "$CHART/Chart.yaml"; }
chart_version="$(chart_field version)"
app_version="$(chart_field appVersion)"
[[ -n "$crate_version" ]] || die "no version in Cargo.toml's [package]"
[[ "$chart_version" == "$crate_version" && "$app_version" == "$crate_version" ]] \
  || die "Chart.yaml has version '$chart_version' and appVersion '$app_version'; Cargo.toml has '$crate_version': they must agree (docs/releasing.md)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
src="$CHART"
if [[ -n "$image_repository" ]]; then
  cp -R "$CHART" "$work/modelgate"
  src="$work/modelgate"
  # The first `  repository:` of the top-level `image:` block.
  awk -v repo="$image_repository" '
    /^[^ #]/ { in_image = ($0 == "image:") }
    in_image && !done && /^  repository:/ { print "  repository: " repo; done = 1; next }
    { print }
    END { if (!done) exit 3 }
  ' "$CHART/values.yaml" >"$src/values.yaml" || die "no image.repository line in $CHART/values.yaml"
fi

mkdir -p "$out"
out="$(cd "$out" && pwd)"
"$HELM" package "$src" --destination "$out" >&2 || die "helm package failed"
tgz="$out/modelgate-$crate_version.tgz"
[[ -f "$tgz" ]] || die "helm package did not write $tgz"
packaged="$("$HELM" show chart "$tgz")"
grep -qx "version: $crate_version" <<<"$packaged" || die "$tgz does not carry version $crate_version"
echo "package-chart: $tgz (chart $crate_version${image_repository:+, image $image_repository:$crate_version})" >&2

if [[ -n "$push" ]]; then
  "$HELM" push "$tgz" "$push" >&2 || die "helm push $tgz $push failed (helm registry login first)"
  echo "package-chart: pushed to ${push%/}/modelgate:$crate_version" >&2
fi
echo "$tgz"
