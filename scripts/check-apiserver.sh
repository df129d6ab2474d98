#!/usr/bin/env bash
# kube-apiserver as the client: Go programs under tests/apiserver rebuild the API
# server's own client-side code (its webhook client, VerifyAdmissionResponse, evanphx/json-patch,
# defaulting, the built-in admission plugins, pod validation, the Job controller's pods) and run
# them against the modelgate binary. Go and its libraries come from Debian, pinned, installed by
# scripts/install-tools.sh into .tools/ and used offline in GOPATH mode.
#
#   scripts/check-apiserver.sh            (MODELGATE_BIN defaults to target/debug/modelgate)
#
# The objects are the corpus, and the backstop (`modelgate backstop`) is evaluated with
# kube-apiserver's own admission-policy CEL: the kube-cel binaries (vap130, vap131, vap132, vap136)
# in $KUBE_CEL_DIR; both as scripts/inputs.sh resolves them (.inputs/corpus, .inputs/kube-cel and
# its README.md; docs/test-inputs.md).
#
# Each command prints what it checked and its counts; any failure fails this script.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"
MODELGATE_BIN="${MODELGATE_BIN:-target/debug/modelgate}"
OUT="$REPO/target/apiserver"
INPUTS="${MODELGATE_INPUTS_DIR:-.inputs}"
[[ "$INPUTS" == /* ]] || INPUTS="$REPO/$INPUTS"
CORPUS="$INPUTS/corpus"

if [[ -n "${KUBE_CEL_DIR:-}" ]]; then
  scripts/inputs.sh --quiet corpus
else
  scripts/inputs.sh --quiet corpus kube-cel
  KUBE_CEL_DIR="$INPUTS/kube-cel"
fi
scripts/install-tools.sh
[[ -x "$MODELGATE_BIN" ]] || { echo "check-apiserver: $MODELGATE_BIN not found (cargo build first)" >&2; exit 1; }

export GO111MODULE=off GOFLAGS= GOROOT= GOPATH="$REPO/tests/apiserver:$TOOLS/gopath" GOCACHE="$TOOLS/gocache"
GO="$TOOLS/go/bin/go"
mkdir -p "$OUT"

step() { printf '\n--> %s\n' "$*"; }

step "gofmt and go vet (tests/apiserver)"
unformatted="$("$TOOLS/go/bin/gofmt" -l tests/apiserver/src)"
[[ -z "$unformatted" ]] || { echo "not gofmt-formatted:"; echo "$unformatted"; exit 1; }
"$GO" vet apiserver/...

step "go build each command into $OUT"
for cmd in tests/apiserver/src/apiserver/cmd/*/; do
  name="$(basename "$cmd")"
  "$GO" build -o "$OUT/$name" "apiserver/cmd/$name"
done

# --- objects: the corpus, the examples and generated cache hits through the admission chain ---
step "conformance: objects through kube-apiserver's admission chain ($MODELGATE_BIN), the backstop through kube-apiserver's CEL ($KUBE_CEL_DIR)"
failed=0
RESULTS="$OUT/conformance-objects"
# The backstop as the binary under test renders it (the ValidatingAdmissionPolicy, then its
# binding); the harness reads the YAML stream itself (ghodss/yaml).
"$MODELGATE_BIN" backstop >"$OUT/backstop.yaml"
"$OUT/conformance" -modelgate "$MODELGATE_BIN" -corpus "$CORPUS" -examples examples -out "$RESULTS" \
  -backstop-vap "$OUT/backstop.yaml" -kube-cel "$KUBE_CEL_DIR" \
  -ml-kinds-requests "$OUT/ml-kinds-requests.json" || failed=1

step "conformance: the stored objects against the schema (kubernetes-validate --strict, 1.33 and 1.37)"
# An object whose input already fails the schema (the corpus holds some) is reported, not
# counted: only what the patch broke fails the run.
kv() { (cd "$RESULTS" && "$TOOLS/bin/kubernetes-validate" --strict -k 1.33.0 -k 1.37.0 "$1"/*.json 2>&1 || true); }
final="$(kv final)"
input="$(kv input)"
total="$(find "$RESULTS/final" -name '*.json' | wc -l)"
passed="$(grep -c '^INFO .* passed for resource ' <<<"$final" || true)"
broken=0 preexisting=0
while IFS= read -r line; do
  [[ -n "$line" ]] || continue
  file="$(sed -E 's#^[A-Z]+ final/([^ ]+).*#\1#' <<<"$line")"
  if grep -q "input/$file" <<<"$input"; then
    preexisting=$((preexisting + 1)); echo "already invalid as written: $line"
  else
    broken=$((broken + 1)); echo "FAIL [schema] $line"
  fi
done < <(grep -v '^INFO .* passed for resource ' <<<"$final")
echo "schema: $total stored objects x 2 versions: $passed passed, $preexisting results invalid in the input already, $broken broken by the patch"
[[ "$broken" -eq 0 ]] || failed=1
# Every object judged once per version, by a verdict line: a tool that crashed, skipped a file or
# printed something else must not pass for a validation (its exit status is not used above,
# since it fails for the inputs that were invalid already).
verdicts="$(grep -cE '^(INFO .* passed|ERROR .* did not validate) for resource ' <<<"$final" || true)"
if [[ "$total" -eq 0 || "$verdicts" -ne $((2 * total)) || "$((passed + preexisting + broken))" -ne "$verdicts" ]]; then
  echo "FAIL [schema] kubernetes-validate gave $verdicts verdicts and $((passed + preexisting + broken - verdicts)) other lines for $total objects x 2 versions:"
  grep -vE '^(INFO .* passed|ERROR .* did not validate) for resource ' <<<"$final" | head -20
  failed=1
fi

step "transport: idle connections, a burst, the connection cap, slow senders, a rolling restart, certificate rotation (kube-apiserver's webhook client)"; "$OUT/transport" -bin "$MODELGATE_BIN" || failed=1
[[ "$failed" -eq 0 ]] || { echo "check-apiserver: FAILED (see above)"; exit 1; }
echo "check-apiserver: ok"
