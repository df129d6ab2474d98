#!/usr/bin/env bash
# Builds the modelgate image from the repository's Dockerfile and, with --push, pushes it to the
# registry the name points at (the chart's default ghcr.io/modelgate/modelgate is not published:
# every install builds and pushes its own image first, see docs/install.md).
#
#   scripts/build-image.sh IMAGE [--push] [--platform PLATFORM]
#   scripts/build-image.sh registry.example.com/platform/modelgate:0.1.0 --push
#
# The Dockerfile needs BuildKit (`# syntax=docker/dockerfile:1`, `RUN --mount=type=cache`):
# with a Docker daemon it builds with `docker buildx build`; without one (rootless hosts, CI
# runners without a daemon) with `podman build` or `buildah build` (both 1.24 or newer understand
# the cache mounts). Legacy `DOCKER_BUILDKIT=0 docker build` cannot build it.
# MODELGATE_IMAGE_BUILDER=docker|podman|buildah picks one explicitly.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  sed -n '6,7p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

image=""
push=0
platform="${MODELGATE_IMAGE_PLATFORM:-linux/amd64}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --push) push=1 ;;
    --platform)
      [[ $# -ge 2 ]] || usage
      platform="$2"
      shift
      ;;
    -h | --help) usage ;;
    -*)
      echo "build-image: unknown option $1" >&2
      usage
      ;;
    *)
      [[ -z "$image" ]] || usage
      image="$1"
      ;;
  esac
  shift
done
[[ -n "$image" ]] || usage

builder="${MODELGATE_IMAGE_BUILDER:-}"
if [[ -z "$builder" ]]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1; then
    builder=docker
  elif command -v podman >/dev/null; then
    builder=podman
  elif command -v buildah >/dev/null; then
    builder=buildah
  else
    cat >&2 <<'EOF'
build-image: no image builder found. One of these is needed:
  - Docker with a running daemon and the buildx plugin (docker buildx version);
  - podman or buildah (no daemon needed).
EOF
    exit 1
  fi
fi

cd "$REPO"
# The commit the binary reports (`modelgate --version`): the build context has no .git.
commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
commit_date="$(git log -1 --format=%cs 2>/dev/null || true)"
build_args=(--build-arg "MODELGATE_COMMIT=$commit" --build-arg "MODELGATE_COMMIT_DATE=$commit_date")
echo "build-image: building $image for $platform with $builder" >&2
case "$builder" in
  docker)
    # --push sends the image straight from BuildKit; otherwise --load puts it in the local store.
    if [[ $push == 1 ]]; then
      docker buildx build --platform "$platform" "${build_args[@]}" --tag "$image" --push .
    else
      docker buildx build --platform "$platform" "${build_args[@]}" --tag "$image" --load .
    fi
    ;;
  podman)
    podman build --platform "$platform" "${build_args[@]}" --format docker --tag "$image" .
    [[ $push == 0 ]] || podman push "$image"
    ;;
  buildah)
    buildah build --platform "$platform" "${build_args[@]}" --format docker --tag "$image" .
    [[ $push == 0 ]] || buildah push "$image"
    ;;
  *)
    echo "build-image: MODELGATE_IMAGE_BUILDER must be docker, podman or buildah, not '$builder'" >&2
    exit 2
    ;;
esac
echo "build-image: $image $([[ $push == 1 ]] && echo pushed || echo built)" >&2
