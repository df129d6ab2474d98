#!/usr/bin/env bash
# Resolves the tests' inputs from outside the repository (tests/inputs.json lists each one, its
# origin and the sha256 of every file) into one place the tests read, $MODELGATE_INPUTS_DIR
# (default .inputs/, gitignored): .inputs/corpus/, .inputs/advisory-db/, .inputs/kube-cel/.
# docs/test-inputs.md says what they are and how to update a pin.
#
#   scripts/inputs.sh                      every input
#   scripts/inputs.sh corpus kube-cel      only these
#   scripts/inputs.sh --pin NAME           rewrite NAME's checksums in tests/inputs.json from the
#                                          mirror (after the mirror was updated on purpose)
#   scripts/inputs.sh --pin corpus --from-origin   the same from the origin (after a commit of
#                                          tests/inputs.json's corpus.sources was changed)
#
# Each input comes, in this order, from:
#   1. what was resolved before, when every file still verifies (nothing is read elsewhere);
#   2. a mirror: the directory MODELGATE_INPUTS_MIRROR names (`none`: no mirror), else ../shared
#      beside the repository when it exists (the team's machines and CI have one);
#   3. its origin: the corpus is fetched file by file from MODELGATE_INPUTS_ORIGIN (default
#      https://raw.githubusercontent.com: <origin>/<repo>/<commit>/<path>); for the advisory
#      database, cargo-audit fetches it itself (unpinned) when scripts/audit.sh runs; the kube-cel
#      binaries are built, not fetched (no build runs here: docs/test-inputs.md).
# Every file is verified against its sha256 whichever way it came; a file that differs is an
# error naming it (exit 1), and nothing is replaced. An input that cannot be had is reported in
# one line, with what to do (exit 2). Writes only under $MODELGATE_INPUTS_DIR, under a lock.
#
# Environment: MODELGATE_INPUTS_DIR, MODELGATE_INPUTS_MIRROR, MODELGATE_INPUTS_ORIGIN (above);
# MODELGATE_INPUTS_TIMEOUT (seconds per request, default 15); MODELGATE_ADVISORY_DB_URL (where
# cargo-audit would fetch the database from, probed when there is no mirror); and, for the tests
# of this script (tests/assets/test_inputs.py), MODELGATE_INPUTS_MANIFEST (another manifest).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
INPUTS="${MODELGATE_INPUTS_DIR:-.inputs}"
[[ "$INPUTS" == /* ]] || INPUTS="$REPO/$INPUTS"
TOOLS="${MODELGATE_TOOLS_DIR:-$REPO/.tools}"

# The mirror locator: the one place that knows of ../shared.
if [[ -n "${MODELGATE_INPUTS_MIRROR+set}" ]]; then
  MIRROR="$MODELGATE_INPUTS_MIRROR"
  MIRROR_SAID="MODELGATE_INPUTS_MIRROR=${MIRROR:-none}"
  if [[ -z "$MIRROR" || "$MIRROR" == none ]]; then
    MIRROR=""
  elif [[ ! -d "$MIRROR" ]]; then
    echo "inputs: MODELGATE_INPUTS_MIRROR=$MIRROR is not a directory" >&2
    exit 2
  fi
elif [[ -d "$REPO/../shared" ]]; then
  MIRROR="$(cd "$REPO/../shared" && pwd)"
  MIRROR_SAID="$MIRROR"
else
  MIRROR=""
  MIRROR_SAID="no ../shared beside the repository and MODELGATE_INPUTS_MIRROR unset"
fi
ORIGIN="${MODELGATE_INPUTS_ORIGIN:-https://raw.githubusercontent.com}"

# The tools' Python has the pinned PyYAML, which one derived corpus file needs when it is
# fetched; any python3 does otherwise.
PYTHON=python3
[[ -x "$TOOLS/venv/bin/python" ]] && PYTHON="$TOOLS/venv/bin/python"
command -v "$PYTHON" >/dev/null || { echo "inputs: python3 is required (to read tests/inputs.json)" >&2; exit 2; }

mkdir -p "$INPUTS"
exec 9>"$INPUTS/.lock"
flock 9

export REPO INPUTS MIRROR MIRROR_SAID ORIGIN
exec "$PYTHON" - "$@" <<'PY'
import argparse, concurrent.futures, hashlib, json, os, re, shutil, sys, tempfile
import urllib.error, urllib.parse, urllib.request

REPO, INPUTS, MIRROR, MIRROR_SAID, ORIGIN = (os.environ[k] for k in ("REPO", "INPUTS", "MIRROR", "MIRROR_SAID", "ORIGIN"))
ORIGIN = ORIGIN.rstrip("/")
# Another manifest, for the tests of this script (tests/assets/test_inputs.py).
MANIFEST = os.environ.get("MODELGATE_INPUTS_MANIFEST") or os.path.join(REPO, "tests", "inputs.json")
MANIFEST_NAME = os.path.relpath(MANIFEST, REPO) if os.path.abspath(MANIFEST).startswith(REPO + os.sep) else MANIFEST
TIMEOUT = float(os.environ.get("MODELGATE_INPUTS_TIMEOUT", "15"))
# Where cargo-audit fetches the database from when there is no mirror (probed, not cloned, here).
ADVISORY_URL = os.environ.get("MODELGATE_ADVISORY_DB_URL", "https://github.com/rustsec/advisory-db.git")
DOCS = "docs/test-inputs.md"


class Mismatch(Exception):
    """A file that is not what the manifest pins (exit 1)."""


class Unreachable(Exception):
    """The origin cannot be reached at all (exit 2): str() is '<scheme>://<host>: unreachable (why)'."""

    def __init__(self, url, err):
        reason = getattr(err, "reason", err)
        why = getattr(reason, "strerror", None) or str(reason)
        u = urllib.parse.urlsplit(url)
        super().__init__(f"{u.scheme}://{u.netloc}: unreachable ({why})")


class Unavailable(Exception):
    """One input, or one file of it, cannot be had (exit 2)."""


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def say(msg):
    if not ARGS.quiet:
        print(f"inputs: {msg}", flush=True)


def load():
    with open(MANIFEST, encoding="utf-8") as f:
        return json.load(f)


# --- verification -----------------------------------------------------------------------------

def verify_tree(name, spec, root):
    """Whether root holds exactly the pinned files (and modes). Reads every file."""
    if not os.path.isdir(root):
        return False
    present = set()
    for d, _, fs in os.walk(root):
        present.update(os.path.relpath(os.path.join(d, f), root) for f in fs)
    if present != set(spec["files"]):
        return False
    for rel, e in spec["files"].items():
        p = os.path.join(root, rel)
        with open(p, "rb") as f:
            if sha256(f.read()) != e["sha256"]:
                return False
        if e.get("executable") and not os.access(p, os.X_OK):
            return False
    return True


def check(name, rel, data, e, where):
    got = sha256(data)
    if got != e["sha256"]:
        raise Mismatch(f"{name}/{rel}: sha256 {got}, but {MANIFEST_NAME} pins {e['sha256']} (from {where})")


# --- the origin ---------------------------------------------------------------------------------

def get(url):
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
            return r.read()
    except urllib.error.HTTPError as err:
        raise Unavailable(f"{url} answered {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        raise Unreachable(url, err) from None


def origin_url(repo, commit, path):
    return f"{ORIGIN}/{repo}/{commit}/{urllib.parse.quote(path)}"


def build(spec, rel, e, upstream):
    """The corpus file `rel` made from its upstream file, as tests/inputs.json describes it."""
    ex = e.get("extract") or {}
    text = lambda: upstream.decode("utf-8")
    if not ex:
        body = upstream
    elif "lines" in ex:
        lines = upstream.split(b"\n")
        body = b"\n".join(lines[ex["lines"]["from"] - 1 : ex["lines"]["to"]]) + b"\n"
    elif "go-admission-request" in ex:
        line = text().split("\n")[ex["go-admission-request"]["line"] - 1]
        m = re.search(r"request:\s*\[\]byte\(`(.*)`\)", line)
        if not m:
            raise Unavailable(f"corpus/{rel}: no `request: []byte(`...`)` on line {ex['go-admission-request']['line']} of {e['path']}")
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": json.loads(m.group(1))}
        body = json.dumps(review, indent=1).encode()
    elif "rust-raw-string" in ex:
        name = ex["rust-raw-string"]["const"]
        m = re.search(r"const " + re.escape(name) + r": &str = r#\"(.*?)\"#;", text(), re.S)
        if not m:
            raise Unavailable(f"corpus/{rel}: no const {name} in {e['path']}")
        body = m.group(1).encode()
    elif "markdown-block" in ex:
        p = ex["markdown-block"]
        blocks = re.findall(r"```" + re.escape(p["lang"]) + r"\n(.*?)```", text(), re.S)
        if len(blocks) <= p["index"]:
            raise Unavailable(f"corpus/{rel}: {e['path']} has no ```{p['lang']} block {p['index']}")
        body = blocks[p["index"]].encode()
    elif "markdown-yaml-objects" in ex:
        try:
            import yaml
        except ImportError:
            raise Unavailable(f"corpus/{rel} is re-serialized with PyYAML, which {sys.executable} lacks: install python3-yaml, or run scripts/install-tools.sh first (its venv has it)") from None
        skip = set(ex["markdown-yaml-objects"]["except-kinds"])
        docs = []
        for block in re.findall(r"```yaml\n(.*?)```", text(), re.S):
            for d in yaml.safe_load_all(block):
                if isinstance(d, dict) and "kind" in d and d["kind"] not in skip:
                    docs.append(d)
        body = yaml.safe_dump_all(docs, sort_keys=False).encode()
    else:
        raise Unavailable(f"corpus/{rel}: unknown extract {sorted(ex)} in {MANIFEST_NAME}")
    if "annotate" in e:
        commit = spec["sources"][e["repo"]]
        head = [f"# source: github.com/{e['repo']}@{commit}:{e['path']}{e.get('note', '')}"] + e["annotate"]
        body = ("\n".join(head) + "\n").encode() + body
    return body


def fetch_all(name, spec):
    """Every file of a fetched input, built from its upstream file and verified: {rel: bytes}."""
    wanted = {}
    for rel, e in spec["files"].items():
        wanted.setdefault((e["repo"], spec["sources"][e["repo"]], e["path"]), []).append(rel)
    upstream = {}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = {pool.submit(get, origin_url(*key)): key for key in wanted}
        try:
            for fut in concurrent.futures.as_completed(futures):
                upstream[futures[fut]] = fut.result()
        except Unreachable:
            for f in futures:
                f.cancel()
            raise
    out, bad = {}, []
    for key, rels in wanted.items():
        for rel in rels:
            e = spec["files"][rel]
            data = build(spec, rel, e, upstream[key])
            try:
                check(name, rel, data, e, origin_url(*key))
            except Mismatch as err:
                bad.append(str(err))
            out[rel] = data
    if bad:
        raise Mismatch("\n".join(bad))
    return out


def probe(url):
    """Whether url answers at all (any HTTP status does)."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=TIMEOUT).close()
    except urllib.error.HTTPError:
        pass
    except (urllib.error.URLError, OSError) as err:
        raise Unreachable(url, err) from None


# --- the mirror ---------------------------------------------------------------------------------

def mirror_dir(spec):
    if not MIRROR:
        return None
    d = os.path.normpath(os.path.join(MIRROR, spec["mirror"]))
    # The mirror has this input when it has one of its files (a partial mirror is an error below).
    if any(os.path.isfile(os.path.join(d, rel)) for rel in spec["files"]):
        return d
    return None


def from_mirror(name, spec, d):
    out, bad = {}, []
    for rel, e in spec["files"].items():
        p = os.path.join(d, rel)
        if not os.path.isfile(p):
            bad.append(f"{name}/{rel}: missing from the mirror ({p})")
            continue
        with open(p, "rb") as f:
            data = f.read()
        try:
            check(name, rel, data, e, p)
        except Mismatch as err:
            bad.append(str(err))
        out[rel] = data
    if bad:
        raise Mismatch("\n".join(bad))
    return out


# --- resolution ---------------------------------------------------------------------------------

def install(name, spec, files):
    """Writes the verified files as INPUTS/name, replacing what was there in one rename."""
    for stale in os.listdir(INPUTS):  # left by an install that was interrupted (we hold the lock)
        if stale.startswith(f".{name}."):
            shutil.rmtree(os.path.join(INPUTS, stale), ignore_errors=True)
    tmp = tempfile.mkdtemp(prefix=f".{name}.", dir=INPUTS)
    os.chmod(tmp, 0o755)
    for rel, data in files.items():
        p = os.path.join(tmp, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, 0o755 if spec["files"][rel].get("executable") else 0o644)
    dest = os.path.join(INPUTS, name)
    old = None
    if os.path.lexists(dest):
        old = tempfile.mkdtemp(prefix=f".{name}.old.", dir=INPUTS)
        os.rename(dest, os.path.join(old, name))
    os.rename(tmp, dest)
    if old:
        shutil.rmtree(old, ignore_errors=True)
    marker = os.path.join(INPUTS, f"{name}.fetch")
    if os.path.exists(marker):
        os.remove(marker)


def resolve(name, spec, state):
    """Resolves one input. Returns None when done, else why it is missing (for the one line)."""
    dest = os.path.join(INPUTS, name)
    n = f"{len(spec['files'])} file{'s' if len(spec['files']) != 1 else ''}"
    if verify_tree(name, spec, dest):
        say(f"{name}: {n} verified in {dest}")
        return None
    d = mirror_dir(spec)
    if d:
        install(name, spec, from_mirror(name, spec, d))
        say(f"{name}: {n} from the mirror {d}, verified, in {dest}")
        return None
    how = spec["online"]
    if how == "fetch":
        if state.get("unreachable"):
            return ("origin", name)
        try:
            files = fetch_all(name, spec)
        except Unreachable as err:
            state["unreachable"] = str(err)
            return ("origin", name)
        install(name, spec, files)
        say(f"{name}: {n} fetched from {ORIGIN}, verified, in {dest}")
        return None
    if how == "cargo-audit":
        try:
            probe(ADVISORY_URL)
        except Unreachable as err:
            state["advisory"] = str(err)
            return ("cargo-audit", name)
        if os.path.lexists(dest):
            shutil.rmtree(dest)
        with open(os.path.join(INPUTS, f"{name}.fetch"), "w") as f:
            f.write(f"no mirror: cargo-audit fetches the advisory database from {ADVISORY_URL} (newest commit, not pinned)\n")
        say(f"{name}: no mirror; scripts/audit.sh lets cargo-audit fetch it from {ADVISORY_URL} (newest, not the pinned {spec['commit'][:12]})")
        return None
    return (how, name)


def one_line(missing, state):
    """The one line that says what is missing and how to get it."""
    by = {}
    for how, name in missing:
        by.setdefault(how, []).append(name)
    parts = []
    if "origin" in by:
        parts.append(f"{', '.join(by['origin'])} from {state['unreachable']}")
    if "cargo-audit" in by:
        parts.append(f"{', '.join(by['cargo-audit'])} (cargo-audit) from {state['advisory']}")
    if "build" in by:
        parts.append(f"{', '.join(by['build'])}: built, not fetched ({DOCS}#kube-cel)")
    names = [n for _, n in missing]
    mirror = f"Not in the mirror {MIRROR}" if MIRROR else f"No mirror ({MIRROR_SAID})"
    return (f"inputs: missing {', '.join(names)}. {mirror}; {'; '.join(parts)}. "
            f"Point MODELGATE_INPUTS_MIRROR at the team's mirror (laid out as ../shared), or go online, then run scripts/inputs.sh again ({DOCS}).")


# --- pinning ------------------------------------------------------------------------------------

def dump(manifest):
    compact = {"files", "sources", "upstream"}

    def render(v, ind, flat):
        if isinstance(v, dict) and v:
            pad = " " * ind
            items = [pad + " " + json.dumps(k) + ": " + (json.dumps(x) if flat else render(x, ind + 1, k in compact)) for k, x in v.items()]
            return "{\n" + ",\n".join(items) + "\n" + pad + "}"
        return json.dumps(v)

    with open(MANIFEST + ".tmp", "w", encoding="utf-8") as f:
        f.write(render(manifest, 0, False) + "\n")
    os.replace(MANIFEST + ".tmp", MANIFEST)


def pin(manifest, name, from_origin):
    spec = manifest["inputs"][name]
    if from_origin:
        if spec["online"] != "fetch":
            sys.exit(f"inputs: --from-origin: {name} is not fetched from an origin")
        files = {}
        wanted = {}
        for rel, e in spec["files"].items():
            wanted.setdefault((e["repo"], spec["sources"][e["repo"]], e["path"]), []).append(rel)
        for key, rels in wanted.items():
            up = get(origin_url(*key))
            for rel in rels:
                files[rel] = build(spec, rel, spec["files"][rel], up)
        where = ORIGIN
    else:
        d = os.path.normpath(os.path.join(MIRROR, spec["mirror"])) if MIRROR else None
        if not d or not os.path.isdir(d):
            sys.exit(f"inputs: --pin {name}: no mirror ({MIRROR_SAID})")
        if spec.get("listing") == "all":
            rels = sorted(os.path.relpath(os.path.join(r, f), d) for r, _, fs in os.walk(d) for f in fs)
        else:
            rels = list(spec["files"])
            for r, _, fs in os.walk(d):
                for f in fs:
                    rel = os.path.relpath(os.path.join(r, f), d)
                    if rel not in spec["files"] and name == "corpus" and f not in ("README.md", "_manifest.json"):
                        print(f"inputs: {name}/{rel} is in the mirror but not in {MANIFEST_NAME}: add its entry (origin) by hand")
        files = {}
        for rel in rels:
            p = os.path.join(d, rel)
            if not os.path.isfile(p):
                sys.exit(f"inputs: --pin {name}: {rel} is pinned but missing from {d}")
            with open(p, "rb") as f:
                files[rel] = f.read()
        where = d
        if name == "advisory-db" and os.path.isfile(os.path.join(d, "SNAPSHOT")):
            spec["commit"] = files["SNAPSHOT"].decode().split()[0]
    old = spec["files"]
    new = {}
    for rel in sorted(files):
        e = {k: v for k, v in old.get(rel, {}).items() if k != "sha256"}
        if not from_origin and spec.get("listing") == "all" and rel != "README.md" and os.access(os.path.join(where, rel), os.X_OK):
            e["executable"] = True
        new[rel] = {"sha256": sha256(files[rel]), **e}
    changed = [r for r in new if r in old and old[r]["sha256"] != new[r]["sha256"]]
    added = [r for r in new if r not in old]
    removed = [r for r in old if r not in new]
    spec["files"] = new
    dump(manifest)
    print(f"inputs: {name} pinned from {where}: {len(changed)} changed, {len(added)} added, {len(removed)} removed ({len(new)} files); review `git diff {MANIFEST_NAME}`")


# --- main ---------------------------------------------------------------------------------------

def main():
    global ARGS
    p = argparse.ArgumentParser(prog="scripts/inputs.sh", description="Resolve the tests' external inputs (tests/inputs.json) into $MODELGATE_INPUTS_DIR.")
    p.add_argument("names", nargs="*", help="inputs to resolve (default: every one)")
    p.add_argument("-q", "--quiet", action="store_true", help="say nothing when all is well")
    p.add_argument("--pin", metavar="NAME", help="rewrite NAME's checksums in tests/inputs.json from the mirror")
    p.add_argument("--from-origin", action="store_true", help="with --pin corpus: from the origin instead")
    ARGS = p.parse_args()
    manifest = load()
    inputs = manifest["inputs"]
    if ARGS.pin:
        if ARGS.pin not in inputs:
            sys.exit(f"inputs: no input {ARGS.pin} in {MANIFEST_NAME} ({', '.join(inputs)})")
        try:
            pin(manifest, ARGS.pin, ARGS.from_origin)
        except (Unreachable, Unavailable) as err:
            sys.exit(f"inputs: --pin {ARGS.pin}: {err}")
        return 0
    names = ARGS.names or list(inputs)
    unknown = [n for n in names if n not in inputs]
    if unknown:
        print(f"inputs: no input {', '.join(unknown)} in {MANIFEST_NAME} ({', '.join(inputs)})", file=sys.stderr)
        return 64
    state, missing, failed = {}, [], False
    for name in names:
        try:
            why = resolve(name, inputs[name], state)
        except Mismatch as err:
            print(f"inputs: {err}".replace("\n", "\ninputs: "), file=sys.stderr)
            failed = True
            continue
        except Unavailable as err:
            print(f"inputs: {name}: {err}", file=sys.stderr)
            missing.append(("file", name))
            continue
        if why:
            missing.append(why)
    unreported = [m for m in missing if m[0] != "file"]
    if unreported:
        print(one_line(unreported, state), file=sys.stderr)
    if failed:
        return 1
    return 2 if missing else 0


sys.exit(main())
PY
