"""The pinned tools (scripts/install-tools.sh) and the repository, as the tests use them."""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from k8s import crd_files, crd_validators, expect, load, one

REPO = Path(__file__).resolve().parents[2]
NS = "modelgate-system"
# Validate against the oldest Kubernetes the assets target (1.33) and the newest the validator knows.
K8S_VERSIONS = ("1.33.0", "1.37.0")
# Kinds served from Kubernetes 1.36 only (admissionregistration.k8s.io/v1): validated against the
# versions that have them.
SINCE_1_36 = ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
# Custom resources kubernetes-validate has no schema for. monitoring.coreos.com objects are
# validated against the CRDs pinned in crds/ instead; cert-manager's and KServe's are not.
PINNED_CRDS = Path(__file__).resolve().parent / "crds"
UNVALIDATED_GROUPS = ("cert-manager.io", "serving.kserve.io")

_PASSED = re.compile(r"^INFO .* passed for resource ")
_NO_SCHEMA = re.compile(r"^WARN .* Couldn't find schema for kind [A-Za-z]+ with api version ([a-z0-9.-]+)/")


def run(*cmd: str | os.PathLike, ok: bool = True, **kw) -> subprocess.CompletedProcess:
    """Runs a tool; with ok=True its failure fails the test with its output."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if ok:
        expect(r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r


@dataclass
class Assets:
    """Paths, tools and the renders a test session shares (each render is made once)."""

    work: Path
    bin: Path = field(default_factory=lambda: Path(os.environ.get("MODELGATE_TOOLS_DIR", REPO / ".tools")) / "bin")
    chart: Path = REPO / "charts" / "modelgate"
    manifests: Path = REPO / "manifests"
    _renders: dict[str, Path] = field(default_factory=dict)

    def tool(self, name: str) -> str:
        """A pinned tool of scripts/install-tools.sh; never one that happens to be on PATH."""
        path = self.bin / name
        expect(path.exists(), f"{name} not found in {self.bin} (scripts/install-tools.sh installs it)")
        return str(path)

    @property
    def helm(self) -> str:
        return self.tool("helm")

    def helm_template(self, *args: str, release: str = "modelgate", namespace: str = NS, ok: bool = True):
        return run(self.helm, "template", release, self.chart, "--namespace", namespace, *args, ok=ok)

    def render(self, name: str, *args: str, release: str = "modelgate", namespace: str = NS) -> Path:
        """helm template for Kubernetes 1.33 into work/NAME.yaml, once per name."""
        if name not in self._renders:
            out = self.helm_template("--kube-version", "1.33.0", *args, release=release, namespace=namespace).stdout
            path = self.work / f"{name}.yaml"
            path.write_text(out)
            self._renders[name] = path
        return self._renders[name]

    def kustomize(self, overlay: str) -> Path:
        key = "k-" + overlay.replace("/", "-")
        if key not in self._renders:
            out = run(self.tool("kubectl"), "kustomize", self.manifests / overlay).stdout
            path = self.work / f"{key}.yaml"
            path.write_text(out)
            self._renders[key] = path
        return self._renders[key]

    def values_file(self, name: str, text: str) -> Path:
        path = self.work / f"{name}.values.yaml"
        path.write_text(text)
        return path

    def validate(self, *files: Path) -> int:
        """kubernetes-validate, strict, for each of K8S_VERSIONS (a file holding a kind of
        SINCE_1_36: those from 1.36 only); monitoring.coreos.com objects against the pinned CRDs.
        Every document must be validated; returns how many were."""
        for f in files:
            expect(Path(f).stat().st_size > 0, f"{f}: nothing to validate")
        newest = [f for f in files if any(d["kind"] in SINCE_1_36 for d in load(str(f)))]
        groups = [([f for f in files if f not in newest], K8S_VERSIONS), (newest, tuple(v for v in K8S_VERSIONS if v >= "1.36"))]
        return sum(self._validate(group, versions) for group, versions in groups if group)

    def _validate(self, files: list[Path], k8s_versions: tuple[str, ...]) -> int:
        versions = [a for v in k8s_versions for a in ("-k", v)]
        r = run(self.tool("kubernetes-validate"), "--strict", *versions, *files, ok=False)
        lines = (r.stdout + r.stderr).splitlines()
        pinned = crd_validators(crd_files(str(PINNED_CRDS)))
        pinned_groups = {api.split("/")[0] for api, _ in pinned}
        bad = []
        for line in lines:
            m = _NO_SCHEMA.match(line)
            if _PASSED.match(line) or (m and m.group(1) in UNVALIDATED_GROUPS + tuple(pinned_groups)):
                continue
            bad.append(line)
        expect(not bad, "kubernetes-validate reported:\n" + "\n".join(bad))
        expect(r.returncode == 0, f"kubernetes-validate exited {r.returncode}:\n{r.stdout}{r.stderr}")
        docs = [d for f in files for d in load(str(f))]
        expect(
            len(lines) == len(docs) * len(k8s_versions),
            f"expected {len(docs) * len(k8s_versions)} results for {len(docs)} documents:\n{r.stdout}{r.stderr}",
        )
        for d in docs:
            key = (d["apiVersion"], d["kind"])
            if key[0].split("/")[0] in pinned_groups:
                expect(key in pinned, f"no pinned CRD for {key} in {PINNED_CRDS}")
                errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in pinned[key].iter_errors(d)]
                expect(not errors, f"{d['kind']} {d['metadata']['name']} does not match its CRD: {errors}")
        return len(docs)

    def rules_for_tests(self, name: str, rendered: Path) -> Path:
        """The PrometheusRule rendered in `rendered`, its annotations dropped (promtool would
        compare them too, and the alert tests are about when an alert fires), as work/NAME.yaml."""
        spec = one(load(str(rendered)), "PrometheusRule")["spec"]
        for group in spec["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path

    def promtool_test(self, rules: Path, name: str, case: dict, ok: bool = True) -> subprocess.CompletedProcess:
        """`promtool test rules` of one case against `rules`, written as work/NAME.yaml."""
        path = self.work / ("".join(ch if ch.isalnum() else "-" for ch in name) + ".yaml")
        path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": [case]}))
        return run(self.tool("promtool"), "test", "rules", path, ok=ok)
