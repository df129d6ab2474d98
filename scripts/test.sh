#!/usr/bin/env bash
# The project's one test command, as the README gives it, and what .ci/run runs:
# formatting, lints, every Rust test (including the replay of the fuzz corpora and regression
# inputs, tests/fuzz_regressions.rs), the pipeline's instructions per admission against their
# ceilings (scripts/instruction-budget.sh), the binary called as kube-apiserver calls it (a Go
# harness, scripts/check-apiserver.sh), the install assets checked with real tools, and the
# dependency audit against the pinned RustSec snapshot. Fails on the first failure.
# Deterministic: exploratory fuzzing is a separate command with its own budget, scripts/fuzz.sh.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

step() { printf '\n==> %s\n' "$*"; }

# First, so that a clone without them stops here, in seconds, saying what is missing and how to
# get it: the corpus, the advisory database and the kube-cel binaries (tests/inputs.json),
# from a mirror or their origin, verified, into .inputs/ (docs/test-inputs.md).
step "external inputs (scripts/inputs.sh: tests/inputs.json, verified, into .inputs/)"
scripts/inputs.sh

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --locked --workspace --all-targets -- -D warnings

step "modelgate-core depends on no runtime, server, Kubernetes client or argument parser"
scripts/check-core-deps.sh

step "pinned tools (scripts/install-tools.sh: kubectl, helm, Go, Python packages, … into .tools/)"
scripts/install-tools.sh

# Every test that needs something from outside the project (the corpus, kubectl, python3,
# openssl, curl) fails without it instead of skipping: the command never goes green untested.
export MODELGATE_REQUIRE_TOOLS=1

step "cargo test --workspace"
cargo test --locked --workspace

step "instruction budget (scripts/instruction-budget.sh: callgrind against benches/instruction-ceilings.toml)"
scripts/instruction-budget.sh

step "kube-apiserver as the client (scripts/check-apiserver.sh: Go harness, tests/apiserver)"
scripts/check-apiserver.sh

step "install assets (tests/assets: helm, kustomize, kubernetes-validate, hadolint, promtool, Prometheus)"
scripts/check-install-assets.sh

step "cargo audit (scripts/audit.sh: the pinned advisory database, .inputs/advisory-db, offline; without a mirror, the newest)"
bash scripts/audit.sh
