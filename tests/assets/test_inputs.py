"""scripts/inputs.sh, the resolver of the tests' external inputs (tests/inputs.json,
docs/test-inputs.md), on its fetch path: a loopback `python3 -m http.server` stands in for the
origin (laid out as raw.githubusercontent.com: <repo>/<commit>/<path>) for a few corpus files,
with no mirror. The files must arrive and verify; a corrupted one must be refused by name; with
no mirror and an unreachable origin, one line must say what is missing and how to get it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import REPO

SCRIPT = REPO / "scripts" / "inputs.sh"
MANIFEST = json.loads((REPO / "tests" / "inputs.json").read_text())
CORPUS = MANIFEST["inputs"]["corpus"]
# One file of each kind the fetch path makes: upstream as it is, upstream after the annotation
# lines, and lines of an upstream file.
VERBATIM = "admissionreview/kubewarden-misc/capabilities-psp-policy__panic.json"
ANNOTATED = "psa/pass_base.yaml"
LINES = "kserve/inferenceservice-config_localModel_snippet.yaml.txt"


def upstream_of(rel: str, corpus: Path) -> bytes:
    """The upstream file a corpus file is made from, rebuilt from the corpus file itself (no
    network here): its annotation lines taken off; for a range of lines, the range placed at its
    line numbers among filler lines."""
    e = CORPUS["files"][rel]
    data = (corpus / rel).read_bytes()
    if "annotate" in e:
        data = data.split(b"\n", 1 + len(e["annotate"]))[-1]
    if "lines" in e.get("extract", {}):
        first = e["extract"]["lines"]["from"]
        data = b"filler\n" * (first - 1) + data + b"filler after the range\n"
    else:
        assert "extract" not in e, f"{rel}: this test rebuilds no {e['extract']}"
    return data


def origin_path(root: Path, rel: str) -> Path:
    e = CORPUS["files"][rel]
    return root / e["repo"] / CORPUS["sources"][e["repo"]] / e["path"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def origin(tmp_path: Path, corpus: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server serving the upstream files of the three corpus files: (URL, root)."""
    root = tmp_path / "origin"
    for rel in (VERBATIM, ANNOTATED, LINES):
        p = origin_path(root, rel)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(upstream_of(rel, corpus))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(root)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the loopback origin did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", root
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture()
def manifest(tmp_path: Path) -> Path:
    """tests/inputs.json with the corpus cut down to the three files (same origins, same sums)."""
    m = {k: v for k, v in MANIFEST.items() if k != "inputs"}
    files = {rel: CORPUS["files"][rel] for rel in (VERBATIM, ANNOTATED, LINES)}
    m["inputs"] = {"corpus": {**CORPUS, "files": files}}
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(m, indent=1))
    return path


def inputs_sh(*args: str, inputs: Path, origin: str, mirror: str = "none", manifest: Path | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MODELGATE_INPUTS_") and k.lower() not in ("http_proxy", "https_proxy")}
    env.update(
        MODELGATE_INPUTS_DIR=str(inputs),
        MODELGATE_INPUTS_MIRROR=mirror,
        MODELGATE_INPUTS_ORIGIN=origin,
        MODELGATE_INPUTS_TIMEOUT="5",
        # cargo-audit's database is probed where it would be fetched from: nowhere, here.
        MODELGATE_ADVISORY_DB_URL=f"http://127.0.0.1:{free_port()}/advisory-db.git",
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    if manifest:
        env["MODELGATE_INPUTS_MANIFEST"] = str(manifest)
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_the_corpus_is_fetched_from_the_origin_and_verified(tmp_path: Path, origin: tuple[str, Path], manifest: Path, corpus: Path) -> None:
    url, _ = origin
    inputs = tmp_path / "inputs"
    r = inputs_sh("corpus", inputs=inputs, origin=url, manifest=manifest)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert f"corpus: 3 files fetched from {url}, verified" in r.stdout, r.stdout
    for rel in (VERBATIM, ANNOTATED, LINES):
        assert (inputs / "corpus" / rel).read_bytes() == (corpus / rel).read_bytes(), rel
    assert sorted(str(p.relative_to(inputs / "corpus")) for p in (inputs / "corpus").rglob("*") if p.is_file()) == sorted(
        (VERBATIM, ANNOTATED, LINES)
    )
    # Resolved once, it is verified in place, without the origin.
    r = inputs_sh("corpus", inputs=inputs, origin=f"http://127.0.0.1:{free_port()}", manifest=manifest)
    assert r.returncode == 0 and "corpus: 3 files verified in" in r.stdout, r.stdout + r.stderr
    # A resolved file changed since is fetched again.
    (inputs / "corpus" / ANNOTATED).write_text("changed\n")
    r = inputs_sh("corpus", inputs=inputs, origin=url, manifest=manifest)
    assert r.returncode == 0 and "fetched from" in r.stdout, r.stdout + r.stderr
    assert (inputs / "corpus" / ANNOTATED).read_bytes() == (corpus / ANNOTATED).read_bytes()


def test_a_corrupted_upstream_file_is_refused_by_name(tmp_path: Path, origin: tuple[str, Path], manifest: Path) -> None:
    url, root = origin
    with origin_path(root, ANNOTATED).open("ab") as f:
        f.write(b"# one more line\n")
    inputs = tmp_path / "inputs"
    r = inputs_sh("corpus", inputs=inputs, origin=url, manifest=manifest)
    assert r.returncode == 1, f"exit {r.returncode}\n{r.stdout}{r.stderr}"
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    e = CORPUS["files"][ANNOTATED]
    assert lines[0].startswith(f"inputs: corpus/{ANNOTATED}: sha256 "), lines[0]
    assert f"pins {e['sha256']}" in lines[0] and e["path"] in lines[0], lines[0]
    assert not (inputs / "corpus").exists(), "a corpus that did not verify was installed"


def test_a_corrupted_mirror_file_is_refused_by_name(tmp_path: Path, manifest: Path, corpus: Path) -> None:
    mirror = tmp_path / "mirror"
    for rel in (VERBATIM, ANNOTATED, LINES):
        (mirror / "corpus" / rel).parent.mkdir(parents=True, exist_ok=True)
        (mirror / "corpus" / rel).write_bytes((corpus / rel).read_bytes())
    unreachable = f"http://127.0.0.1:{free_port()}"
    r = inputs_sh("corpus", inputs=tmp_path / "a", origin=unreachable, mirror=str(mirror), manifest=manifest)
    assert r.returncode == 0 and f"corpus: 3 files from the mirror {mirror / 'corpus'}, verified" in r.stdout, r.stdout + r.stderr
    (mirror / "corpus" / VERBATIM).write_text("{}")
    r = inputs_sh("corpus", inputs=tmp_path / "b", origin=unreachable, mirror=str(mirror), manifest=manifest)
    assert r.returncode == 1 and r.stderr.startswith(f"inputs: corpus/{VERBATIM}: sha256 "), r.stdout + r.stderr
    assert str(mirror / "corpus" / VERBATIM) in r.stderr, r.stderr


def test_no_mirror_and_no_origin_is_one_line_saying_what_to_do(tmp_path: Path) -> None:
    """The whole manifest, as scripts/test.sh resolves it first: nothing can be had."""
    start = time.monotonic()
    r = inputs_sh(inputs=tmp_path / "inputs", origin=f"http://127.0.0.1:{free_port()}")
    assert time.monotonic() - start < 60, "scripts/test.sh must stop in its first minute"
    assert r.returncode == 2, f"exit {r.returncode}\n{r.stdout}{r.stderr}"
    assert r.stdout == "", r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    line = lines[0]
    assert line.startswith("inputs: missing corpus, advisory-db, kube-cel. No mirror (MODELGATE_INPUTS_MIRROR=none); "), line
    for what in (
        "corpus from http://127.0.0.1:",
        "advisory-db (cargo-audit) from http://127.0.0.1:",
        "kube-cel: built, not fetched (docs/test-inputs.md#kube-cel)",
        "Point MODELGATE_INPUTS_MIRROR at the team's mirror",
    ):
        assert what in line, f"{what!r} not in: {line}"
    assert not any((tmp_path / "inputs").glob("[!.]*")), "something was resolved"
