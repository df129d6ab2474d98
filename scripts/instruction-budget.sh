#!/usr/bin/env bash
# The instruction budget: instructions per admission, counted by callgrind, against the ceilings
# in benches/instruction-ceilings.toml. Fails with the measured and the allowed figure, and the
# command that profiles it, when one is over its ceiling. Wall-clock time on a shared machine
# cannot be a test; instruction counts can: the same binary on the same input counts the same,
# whatever else the machine runs.
#
# What is measured, on debug builds (the builds the test command already makes; debug counts are
# ~10 × a release build's, so a ceiling guards the code's shape — a second parse of the body, a
# quadratic loop — not the release figure; docs/benchmarks.md, "The instruction budget"):
# - the pipeline, bytes in → bytes out: examples/profile_pipeline run twice per case, with 1 and
#   with 1 + N admissions of the same review; the difference ÷ N is one admission, without the
#   start-up and the first admission's one-time costs;
# - one `/mutate` through `modelgate serve` end to end (TLS, HTTP/1.1, the pipeline, the log
#   line, the metrics): serve under callgrind, once ready one request on a connection, then
#   1 + N requests on another (curl, kept alive, as the API server sends them), the counters
#   dumped before and after each (callgrind_control); the second part less the first ÷ N.
#
#   scripts/instruction-budget.sh            measure and compare (the test command runs this)
#   scripts/instruction-budget.sh --measure  measure and print the figures with the ceilings
#                                            15 % above them, as lines for the ceilings file
#   MODELGATE_BUDGET_KEEP=DIR ...            keep the callgrind files of serve in DIR
#
# Needs valgrind, curl and python3 on PATH; without them the step says so and passes, except
# under MODELGATE_REQUIRE_TOOLS=1 (scripts/test.sh), where it fails.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

CEILINGS=benches/instruction-ceilings.toml
HEADROOM_PERCENT=15
MODE=check
case "${1:-}" in
  "") ;;
  --measure) MODE=measure ;;
  *) echo "usage: $0 [--measure]" >&2; exit 2 ;;
esac

for tool in valgrind callgrind_control curl python3; do
  if ! command -v "$tool" >/dev/null; then
    if [[ "${MODELGATE_REQUIRE_TOOLS:-}" == 1 ]]; then
      echo "$tool is required for the instruction budget (MODELGATE_REQUIRE_TOOLS=1) but is missing" >&2
      exit 1
    fi
    echo "$tool is missing: instruction budget skipped (MODELGATE_REQUIRE_TOOLS=1 makes this a failure)"
    exit 0
  fi
done

cargo build --locked --quiet --bin modelgate --example profile_pipeline
TARGET_DIR="$(cargo metadata --locked --format-version 1 --no-deps |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
EXAMPLE="$TARGET_DIR/debug/examples/profile_pipeline"
MODELGATE="$TARGET_DIR/debug/modelgate"

# MODELGATE_BUDGET_KEEP=DIR keeps serve's callgrind files (and the rest) in DIR, to read them.
if [[ -n "${MODELGATE_BUDGET_KEEP:-}" ]]; then
  WORK="$MODELGATE_BUDGET_KEEP"
  mkdir -p "$WORK"
else
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
fi

# instructions REVIEW COUNT WEBHOOK: what callgrind counts for the whole run.
instructions() {
  local out="$WORK/callgrind.out"
  valgrind --tool=callgrind --callgrind-out-file="$out" "$EXAMPLE" "$1" "$2" "$3" \
    >"$WORK/stdout" 2>"$WORK/stderr" || {
    cat "$WORK/stderr" >&2
    echo "valgrind $EXAMPLE $1 $2 $3 failed" >&2
    return 1
  }
  awk '/^(summary|totals):/ { print $2; exit }' "$out"
}

# serve_instructions N: instructions of `serve` for N requests (module comment); the review is
# benches/reviews/llm-serving-pod.json without whitespace.
serve_instructions() {
  local n=$1 log="$WORK/serve.log" out="$WORK/serve.callgrind"
  python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1])), sys.stdout, separators=(",", ":"), ensure_ascii=False)' \
    benches/reviews/llm-serving-pod.json >"$WORK/review.json" || return 1
  "$MODELGATE" certs --out "$WORK/certs" --service localhost --namespace budget >/dev/null 2>&1 ||
    { echo "modelgate certs failed" >&2; return 1; }
  valgrind --tool=callgrind --callgrind-out-file="$out" "$MODELGATE" serve \
    --listen 127.0.0.1:0 --probe-listen 127.0.0.1:0 --log-format json --no-cluster \
    --caches benches/reviews/caches.json --shutdown-grace 0s \
    --tls-cert "$WORK/certs/tls.crt" --tls-key "$WORK/certs/tls.key" 2>"$log" &
  local pid=$! probe="" webhook="" i
  # This function runs in its own subshell ($(…)): stop serve if it ends early.
  trap "kill $pid 2>/dev/null || true" EXIT
  addr() { sed -n "s/.*\"listener\":\"$1\",\"addr\":\"\([^\"]*\)\".*/\1/p" "$log" | head -1; }
  # Under valgrind, on a loaded machine, serve can take a minute to start.
  for ((i = 0; i < 3000; i++)); do
    probe="$(addr probe)" webhook="$(addr webhook)"
    [[ -n "$probe" && -n "$webhook" ]] && curl -sf "http://$probe/readyz" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "serve under valgrind exited" >&2; return 1; }
    sleep 0.1
  done
  ((i < 3000)) || { kill "$pid"; cat "$log" >&2; echo "serve under valgrind was not ready within 300 s" >&2; return 1; }
  send() {
    local urls=() k
    for ((k = 0; k < $1; k++)); do
      urls+=(-o /dev/null --url "https://localhost:${webhook##*:}/mutate?timeout=10s")
    done
    curl -sf --http1.1 --cacert "$WORK/certs/ca.crt" -H 'Content-Type: application/json' \
      --resolve "localhost:${webhook##*:}:127.0.0.1" --data-binary @"$WORK/review.json" "${urls[@]}"
  }
  # Dump 1: the start-up; 2: the first connection and request; 3: the next connection's.
  dump() { callgrind_control --dump "$pid" >/dev/null 2>&1; }
  dump && send 1 && dump && send "$((n + 1))" && dump || {
    kill "$pid"; cat "$log" >&2; echo "requests to serve under valgrind failed" >&2; return 1
  }
  kill -TERM "$pid"
  wait "$pid" || true
  local one many
  one="$(awk '/^(summary|totals):/ { print $2; exit }' "$out.2")"
  many="$(awk '/^(summary|totals):/ { print $2; exit }' "$out.3")"
  echo "$(((many - one) / n))"
}

# The cases: the key in the ceilings file, the review, the webhook and N.
CASES=(
  "mutate-llm-serving-pod-compact llm-serving-pod-compact mutate 20"
  "validate-llm-serving-pod-compact llm-serving-pod-compact validate 20"
  "validate-llm-serving-deployment-compact llm-serving-deployment-compact validate 10"
)

ceiling() {
  awk -F= -v key="$1" '
    /^[[:space:]]*#/ { next }
    { k = $1; gsub(/[[:space:]]/, "", k) }
    k == key { v = $2; sub(/#.*/, "", v); gsub(/[[:space:]_]/, "", v); print v; exit }
  ' "$CEILINGS"
}

echo "rustc $(rustc -V | awk '{print $2}'), $(valgrind --version), debug builds"
failed=0
# check KEY PER PROFILE: compares one measured figure with its ceiling.
check() {
  local key=$1 per=$2 profile=$3 allowed
  if [[ "$MODE" == measure ]]; then
    printf '%s = %s  # measured %s\n' "$key" \
      "$(((per * (100 + HEADROOM_PERCENT) / 100 + 999) / 1000 * 1000))" "$per"
    return
  fi
  allowed="$(ceiling "$key")"
  if [[ -z "$allowed" ]]; then
    echo "FAIL $key: no ceiling in $CEILINGS (measured $per instructions per admission)" >&2
    failed=1
  elif ((per > allowed)); then
    echo "FAIL $key: $per instructions per admission, allowed $allowed (+$(((per - allowed) * 100 / allowed)) % over the ceiling)" >&2
    echo "     profile it: $profile" >&2
    failed=1
  else
    echo "ok   $key: $per instructions per admission, allowed $allowed ($((per * 100 / allowed)) % of the ceiling)"
    # A ceiling far above what is measured no longer guards anything: say so.
    if ((per * (100 + 2 * HEADROOM_PERCENT) < allowed * 100)); then
      echo "     note: more than $((2 * HEADROOM_PERCENT)) % under its ceiling; lower it (docs/benchmarks.md, \"The instruction budget\")"
    fi
  fi
}
for case in "${CASES[@]}"; do
  read -r key review webhook n <<<"$case"
  one="$(instructions "$review" 1 "$webhook")"
  many="$(instructions "$review" "$((n + 1))" "$webhook")"
  [[ -n "$one" && -n "$many" ]] || { echo "no instruction count for $key" >&2; exit 1; }
  check "$key" "$(((many - one) / n))" \
    "valgrind --tool=callgrind $EXAMPLE $review $((n + 1)) $webhook && callgrind_annotate --inclusive=yes callgrind.out.<pid>"
done
SERVE_N=20
per="$(serve_instructions "$SERVE_N")"
check serve-mutate-llm-serving-pod-compact "$per" \
  "MODELGATE_BUDGET_KEEP=/tmp/budget $0, then callgrind_annotate --inclusive=yes /tmp/budget/serve.callgrind.3 (the $((SERVE_N + 1)) requests; .2 is the first one)"
if ((failed)); then
  echo "Over the instruction budget. If the rise is the price of a change worth having, raise the ceiling in $CEILINGS in its own commit that says why (docs/benchmarks.md, \"The instruction budget\")." >&2
  exit 1
fi
