"""Releases (docs/releasing.md): one version in Cargo.toml, the chart, its image tag, the manifests
and CHANGELOG.md; `modelgate --version`; the release scripts the workflows call
(scripts/package-chart.sh for real, scripts/release-binaries.sh --check); the workflows linted by
actionlint, their actions pinned by commit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from k8s import load
from tools import REPO, Assets, run

WORKFLOWS = REPO / ".github" / "workflows"
CHART = REPO / "charts" / "modelgate"
DEFAULT_IMAGE = "ghcr.io/modelgate/modelgate"
TARGETS = {"x86_64-unknown-linux-musl": "linux-amd64", "aarch64-unknown-linux-musl": "linux-arm64"}


def crate_version() -> str:
    return tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]


def images(docs: list[dict]) -> list[str]:
    """The image of every container and init container in the rendered objects."""
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key in ("containers", "initContainers"):
                found.extend(c["image"] for c in node.get(key) or [] if isinstance(c, dict) and "image" in c)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for doc in docs:
        walk(doc)
    return found


def workflow(name: str) -> dict:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def runs(wf: dict) -> str:
    """Every `run:` script of a workflow, one after the other."""
    return "\n".join(step.get("run", "") for job in wf["jobs"].values() for step in job.get("steps", []))


# --- one version ----------------------------------------------------------------------------------


def test_chart_version_and_app_version_are_the_crate_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = crate_version()
    assert str(chart["version"]) == version, f"Chart.yaml version {chart['version']} != Cargo.toml {version}"
    assert str(chart["appVersion"]) == version, f"Chart.yaml appVersion {chart['appVersion']} != Cargo.toml {version}"


def test_image_tag_defaults_to_the_app_version(assets: Assets) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] in ("", crate_version()), f"values.yaml image.tag is {values['image']['tag']!r}"
    rendered = images(load(str(assets.render("default"))))
    ours = [i for i in rendered if i.startswith(DEFAULT_IMAGE)]
    assert ours, f"no {DEFAULT_IMAGE} image in the default render: {rendered}"
    assert set(ours) == {f"{DEFAULT_IMAGE}:{crate_version()}"}, ours


def test_manifests_name_the_crate_version() -> None:
    tags = {
        (str(path.relative_to(REPO)), tag)
        for path in (REPO / "manifests").rglob("*.yaml")
        for tag in re.findall(re.escape(DEFAULT_IMAGE) + r":([^\s\"'@]+)", path.read_text())
    }
    assert tags, "no manifest names the image"
    wrong = {(path, tag) for path, tag in tags if tag != crate_version()}
    assert not wrong, f"image tags other than {crate_version()}: {sorted(wrong)}"


def test_changelog_has_unreleased_and_the_crate_version() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings[:1] == ["Unreleased"], f"the first section is not [Unreleased]: {headings}"
    assert crate_version() in headings, f"no ## [{crate_version()}] section in CHANGELOG.md: {headings}"


# --- modelgate --version --------------------------------------------------------------------------


def test_version_flag_names_the_crate_version_and_the_commit(modelgate_bin: Path) -> None:
    out = run(modelgate_bin, "--version").stdout.strip()
    m = re.fullmatch(r"modelgate (\S+) \(commit ([0-9a-f]{12}|unknown)(?:, (\d{4}-\d{2}-\d{2}))?\)", out)
    assert m, f"modelgate --version printed {out!r}"
    assert m.group(1) == crate_version(), f"modelgate --version says {m.group(1)}, Cargo.toml {crate_version()}"
    assert run(modelgate_bin, "-V").stdout.strip() == out
    commit = m.group(2)
    in_git = subprocess.run(["git", "-C", REPO, "rev-parse", "--git-dir"], capture_output=True).returncode == 0
    if commit != "unknown" and in_git:
        r = subprocess.run(["git", "-C", REPO, "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
        assert r.returncode == 0, f"{commit} is not a commit of this repository"
        assert m.group(3), f"no commit date in {out!r}"


# --- scripts/package-chart.sh -----------------------------------------------------------------------


def package_chart(assets: Assets, *args: str | os.PathLike, script: Path = REPO / "scripts" / "package-chart.sh", ok: bool = True):
    return run(script, *args, env={**os.environ, "HELM": assets.helm}, ok=ok)


def test_package_chart_packages_the_crate_version_with_the_image_repository(assets: Assets) -> None:
    before = (CHART / "values.yaml").read_bytes()
    out = assets.work / "chart-package"
    r = package_chart(assets, "--out", out, "--image-repository", "registry.example.com/team/modelgate")
    tgz = out / f"modelgate-{crate_version()}.tgz"
    assert r.stdout.strip() == str(tgz), r.stdout
    assert sorted(p.name for p in out.iterdir()) == [tgz.name]
    with tarfile.open(tgz) as t:
        chart = yaml.safe_load(t.extractfile("modelgate/Chart.yaml").read())
        values = yaml.safe_load(t.extractfile("modelgate/values.yaml").read())
    assert (str(chart["version"]), str(chart["appVersion"])) == (crate_version(), crate_version()), chart
    assert values["image"] == {**yaml.safe_load(before)["image"], "repository": "registry.example.com/team/modelgate"}
    rendered = run(assets.helm, "template", "modelgate", tgz, "--namespace", "modelgate-system").stdout
    assert f"registry.example.com/team/modelgate:{crate_version()}" in images(list(yaml.safe_load_all(rendered)))
    assert (CHART / "values.yaml").read_bytes() == before, "package-chart.sh changed the chart in the tree"


def test_package_chart_without_options_keeps_the_default_image(assets: Assets) -> None:
    out = assets.work / "chart-plain"
    tgz = Path(package_chart(assets, "--out", out).stdout.strip())
    with tarfile.open(tgz) as t:
        assert t.extractfile("modelgate/values.yaml").read() == (CHART / "values.yaml").read_bytes()


@pytest.mark.parametrize(
    "args",
    [["--push", "https://ghcr.io/x"], ["--image-repository", "x: {y: z}"], ["--out"], ["--bogus"]],
    ids=["push-not-oci", "repository-not-a-reference", "missing-value", "unknown-option"],
)
def test_package_chart_refuses_bad_arguments(assets: Assets, args: list[str]) -> None:
    r = package_chart(assets, *args, ok=False)
    assert r.returncode == 2, f"exit {r.returncode}:\n{r.stderr}"


def test_package_chart_refuses_a_chart_behind_the_crate(assets: Assets) -> None:
    repo = assets.work / "repo-behind"
    shutil.copytree(CHART, repo / "charts" / "modelgate")
    (repo / "scripts").mkdir()
    shutil.copy2(REPO / "scripts" / "package-chart.sh", repo / "scripts")
    (repo / "Cargo.toml").write_text('[package]\nname = "modelgate"\nversion = "99.0.0"\n')
    r = package_chart(assets, "--out", assets.work / "behind", script=repo / "scripts" / "package-chart.sh", ok=False)
    assert r.returncode == 1 and "99.0.0" in r.stderr, f"exit {r.returncode}:\n{r.stderr}"
    assert not (assets.work / "behind").exists() or not any((assets.work / "behind").iterdir())


# --- scripts/release-binaries.sh (--check: building needs the musl targets and Zig) ------------------


def release_binaries(*args: str | os.PathLike, ok: bool = True):
    return run(REPO / "scripts" / "release-binaries.sh", "--check", *args, ok=ok)


def test_release_binaries_plan(assets: Assets) -> None:
    out = assets.work / "binaries"
    r = release_binaries("--out", out, "--tag", f"v{crate_version()}")
    plan = [line.split("\t") for line in r.stdout.splitlines()]
    expected = [[t, str(out / f"modelgate-{crate_version()}-{arch}")] for t, arch in TARGETS.items()]
    assert plan == [*expected, ["SHA256SUMS", str(out / "SHA256SUMS")]], r.stdout
    assert not out.exists(), "--check wrote something"


def test_release_binaries_one_target(assets: Assets) -> None:
    r = release_binaries("--out", assets.work / "arm", "--target", "aarch64-unknown-linux-musl")
    assert [line.split("\t")[0] for line in r.stdout.splitlines()] == ["aarch64-unknown-linux-musl", "SHA256SUMS"], r.stdout


def test_release_binaries_refuses_a_tag_that_is_not_the_crate_version() -> None:
    r = release_binaries("--tag", "v0.0.0-not-this", ok=False)
    assert r.returncode == 1, f"exit {r.returncode}:\n{r.stderr}"
    assert f"v{crate_version()}" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "args", [["--target", "x86_64-unknown-linux-gnu"], ["--tag"], ["--bogus"]], ids=["unknown-target", "missing-value", "unknown"]
)
def test_release_binaries_refuses_bad_arguments(args: list[str]) -> None:
    r = release_binaries(*args, ok=False)
    assert r.returncode == 2, f"exit {r.returncode}:\n{r.stderr}"


# --- the workflows --------------------------------------------------------------------------------


def test_actionlint(assets: Assets) -> None:
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} >= {"ci.yml", "release.yml"}, files
    run(assets.tool("actionlint"), "-no-color", *files, cwd=REPO)


def test_actionlint_refuses_a_bad_workflow(assets: Assets) -> None:
    bad = assets.work / "bad-workflow.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-99.04\n    steps:\n      - run: echo ${{ github.event.issue.title }}\n")
    r = run(assets.tool("actionlint"), "-no-color", bad, ok=False)
    assert r.returncode != 0, "actionlint passed a bad workflow"
    assert "[runner-label]" in r.stdout and "[expression]" in r.stdout, r.stdout


def test_third_party_actions_are_pinned_by_commit() -> None:
    uses = [
        (f.name, m.group(1), m.group(2))
        for f in sorted(WORKFLOWS.glob("*.yml"))
        for m in re.finditer(r"^\s*(?:-\s+)?uses:\s*(\S+)(.*)$", f.read_text(), re.M)
    ]
    assert uses
    bad = [
        (name, ref, rest)
        for name, ref, rest in uses
        if not ref.startswith("./") and not (re.fullmatch(r"[\w.-]+/[\w./-]+@[0-9a-f]{40}", ref) and re.fullmatch(r"\s+# v\d+\S*", rest))
    ]
    assert not bad, f"not pinned by full commit SHA with a '# vX.Y.Z' comment: {bad}"


def test_ci_runs_the_test_command_on_pull_requests_and_main() -> None:
    wf = workflow("ci.yml")
    on = wf.get("on", wf.get(True))  # YAML 1.1 reads the key `on` as true
    assert "pull_request" in on and on["push"]["branches"] == ["main"] and "workflow_call" in on, on
    assert re.search(r"^scripts/test\.sh$", runs(wf), re.M), runs(wf)


def test_release_builds_through_the_repository_scripts() -> None:
    wf = workflow("release.yml")
    on = wf.get("on", wf.get(True))
    assert on == {"push": {"tags": ["v*"]}}, on
    scripts = runs(wf)
    for script in ("scripts/release-binaries.sh", "scripts/build-image.sh", "scripts/package-chart.sh", "cosign sign"):
        assert script in scripts, f"release.yml does not run {script}"
    assert wf["jobs"]["test"]["uses"] == "./.github/workflows/ci.yml"


def test_dependabot_watches_cargo_actions_and_docker() -> None:
    config = yaml.safe_load((REPO / ".github" / "dependabot.yml").read_text())
    assert {u["package-ecosystem"] for u in config["updates"]} >= {"cargo", "github-actions", "docker"}
