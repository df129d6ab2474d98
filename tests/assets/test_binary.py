"""The assets against the real binary: the policy each Deployment passes reaches `modelgate
review` as intended, `serve` knows every flag, and the defaults are those of docs/policy.md §2."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import pytest

import checks
from documented_defaults import read_policy_defaults
from k8s import load, policy_flags
from tools import Assets, run

CACHE_POD = """apiVersion: v1
kind: Pod
metadata: {name: p, namespace: team-a}
spec:
  containers:
    - {name: c, image: i, volumeMounts: [{name: model-cache, mountPath: /models}]}
  volumes:
    - {name: model-cache, persistentVolumeClaim: {claimName: cache}}
"""


def review_with(assets: Assets, modelgate_bin: Path, render: Path) -> str:
    """`modelgate review -o patch` of a pod that mounts a PVC model cache, with the policy exactly
    as the rendered Deployment passes it (arguments or MODELGATE_* environment)."""
    args, env = checks.policy_cli(render)
    assert args or env, f"no policy found in {render}"
    pod = assets.work / "cache-pod.yaml"
    pod.write_text(CACHE_POD)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MODELGATE_")}
    r = run(modelgate_bin, "review", "-o", "patch", *args, pod, env={**clean, **env}, ok=False)
    assert r.returncode == 0, f"modelgate review refused the rendered policy (exit {r.returncode}): {env} {args}\n{r.stderr}"
    return r.stdout


def uids(patch: str) -> list[int]:
    return sorted({int(u) for u in re.findall(r'"runAsUser":\s*(\d+)', patch)})


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_default_policy_gives_uid_1000_and_the_fsgroup_prep(assets: Assets, modelgate_bin: Path, source: str) -> None:
    render = assets.render("default") if source == "helm" else assets.kustomize("default")
    patch = review_with(assets, modelgate_bin, render)
    assert '"chown 0:102 /models && chmod g+rwX /models"' in patch, patch
    assert uids(patch) == [0, 1000], f"uids in the patch: {uids(patch)}"


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_openshift_preset_sets_no_ids_and_preps_uid_0_770(assets: Assets, modelgate_bin: Path, source: str) -> None:
    if source == "helm":
        render = assets.render("openshift", "-f", str(assets.chart / "values-openshift.yaml"))
    else:
        render = assets.kustomize("openshift")
    patch = review_with(assets, modelgate_bin, render)
    assert '"chown 101:0 /models && chmod 770 /models"' in patch, patch
    assert uids(patch) == [0], f"the preset set a uid besides the prep's 0: {uids(patch)}"
    assert not re.search(r'"(runAsGroup|fsGroup)"', patch), "the preset set runAsGroup or fsGroup"


def test_big_ids_from_a_values_file_reach_the_binary_as_integers(assets: Assets, modelgate_bin: Path) -> None:
    f = assets.values_file(
        "bin-big", "initContainer:\n  user: 1000680000\nrunAsUser: 1000680000\nrunAsGroup: 1000680000\ndefaultFSGroup: 1000680000\n"
    )
    patch = review_with(assets, modelgate_bin, assets.render("bin-big", "-f", str(f)))
    assert '"chown 0:1000680000 /models && chmod g+rwX /models"' in patch, patch
    assert 1000680000 in uids(patch)


def test_model_cache_prep_never_gives_the_cache_owner_uid_and_no_prep(assets: Assets, modelgate_bin: Path) -> None:
    patch = review_with(assets, modelgate_bin, assets.render("bin-never", "--set", "modelCachePrep=never"))
    assert "model-cache-prep" not in patch, "a prep container under --model-cache-prep=never"
    assert uids(patch) == [101], f"expected the cache owner 101 as uid, got {uids(patch)}"


@pytest.fixture(scope="module")
def serve_help(modelgate_bin: Path) -> dict[str, str | None]:
    """`serve --help`: every flag, with its default where clap shows one."""
    text = run(modelgate_bin, "serve", "--help").stdout
    out: dict[str, str | None] = {}
    for block in re.split(r"\n(?=\s+(?:-\w, )?--)", text):
        m = re.match(r"\s+(?:-\w, )?(--[a-z0-9-]+)", block)
        if m:
            d = re.search(r"\[default: ([^\]]*)\]", block)
            out[m.group(1)] = d.group(1) if d else None
    assert "--run-as-user" in out, text
    return out


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_serve_knows_every_flag_the_deployment_passes(assets: Assets, serve_help, source: str) -> None:
    render = assets.render("default") if source == "helm" else assets.kustomize("default")
    unknown = [f for f in checks.serve_args(render) if f not in serve_help]
    unknown += [f for f in policy_flags(load(render)) if f not in serve_help]
    assert not unknown, f"the Deployment passes {unknown}, which modelgate serve does not know"


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_documented_defaults_are_in_force(assets: Assets, serve_help, source: str) -> None:
    """Each literal default of docs/policy.md §2 is what the rendered Deployment passes, or, where it
    passes nothing, the binary's own default. The install assets pin the prep image's tag by
    digest (the same image, docs/install.md): `--init-image` may carry `@sha256:`."""
    render = assets.render("default") if source == "helm" else assets.kustomize("default")
    in_force = policy_flags(load(render))
    wrong, not_built = [], []
    for flag, want in read_policy_defaults().items():
        if flag in in_force:
            got = in_force[flag]
        elif flag in serve_help:
            got = serve_help[flag]
        else:
            not_built.append(flag)
            continue
        pinned = flag == "--init-image" and re.fullmatch(re.escape(want) + r"@sha256:[0-9a-f]{64}", got)
        if got != want and not pinned:
            wrong.append(f"{flag}: docs/cli.md says {want}, {source} gives {got}")
    assert not wrong, "\n".join(wrong)
    if not_built:
        warnings.warn(f"flags of docs/policy.md §2 this binary does not have yet: {not_built}", stacklevel=1)


CLIENT_LIMITS = [
    "--max-connections", "--max-http2-connections", "--max-concurrent-streams", "--max-requests-in-flight", "--max-header-list-bytes",
    "--max-pending-accept-resets", "--idle-timeout", "--body-progress-timeout", "--max-buffered-body-bytes",
    "--min-body-bytes-per-second",
]  # fmt: skip


@pytest.mark.parametrize("source", ["helm", "kustomize"])
def test_client_limits_in_force_are_the_binarys_defaults(assets: Assets, serve_help, source: str) -> None:
    """The chart passes every client limit (docs/security.md), the kustomize base none: both
    must give the binary's defaults (--max-connections 1024 and --idle-timeout 120s, above the
    API server's 90 s), so that the two installs and the memory formula agree."""
    in_force = policy_flags(load(assets.render("default") if source == "helm" else assets.kustomize("default")))
    got = {flag: in_force.get(flag, serve_help.get(flag)) for flag in CLIENT_LIMITS}
    want = {flag: serve_help.get(flag) for flag in CLIENT_LIMITS}
    assert got == want, f"{source}: {got}, serve --help: {want}"
    assert want["--max-connections"] == "1024" and want["--idle-timeout"] == "120s", want


def test_binary_defaults_are_the_documented_defaults(serve_help) -> None:
    wrong = [
        f"{flag}: docs/cli.md says {want}, serve --help says {serve_help[flag]}"
        for flag, want in read_policy_defaults().items()
        if flag in serve_help and serve_help[flag] != want
    ]
    assert not wrong, "\n".join(wrong)


def test_review_with_fails_on_a_policy_the_binary_refuses(assets: Assets, modelgate_bin: Path) -> None:
    """The harness itself: a policy the binary refuses fails review_with."""
    bad = assets.work / "bad-policy.yaml"
    docs = load(assets.render("default"))
    for d in docs:
        if d["kind"] == "Deployment":
            args = d["spec"]["template"]["spec"]["containers"][0]["args"]
            d["spec"]["template"]["spec"]["containers"][0]["args"] = [
                "--init-container-user=0" if a.startswith("--init-container-user=") else a for a in args
            ]
    bad.write_text("\n---\n".join(json.dumps(d) for d in docs))
    with pytest.raises(AssertionError, match="refused the rendered policy"):
        review_with(assets, modelgate_bin, bad)
