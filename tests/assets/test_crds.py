"""The KServe cache CRDs (manifests/crds, copied into the chart): KServe's own example objects
validate against them, and malformed caches are refused."""

from __future__ import annotations

import filecmp

import cel
import jsonschema
import pytest

from k8s import crd_files, expect, load, of_kind, pruning, structural
from tools import Assets

CRD_EXPECT = {
    "LocalModelCache": ("localmodelcaches", "Cluster"),
    "LocalModelNamespaceCache": ("localmodelnamespacecaches", "Namespaced"),
    "LocalModelNodeGroup": ("localmodelnodegroups", "Cluster"),
}


@pytest.fixture(scope="module")
def validators(assets: Assets) -> dict[str, jsonschema.Draft4Validator]:
    out = {}
    for p in crd_files(str(assets.manifests / "crds"), "*.serving.kserve.io.yaml"):
        for crd in load(p):
            expect(crd["kind"] == "CustomResourceDefinition", p + ": not a CRD")
            spec = crd["spec"]
            kind = spec["names"]["kind"]
            expect(kind in CRD_EXPECT, p + ": unexpected kind " + kind)
            plural, scope = CRD_EXPECT[kind]
            expect(spec["group"] == "serving.kserve.io", kind + ": group must be serving.kserve.io")
            expect(
                spec["names"]["plural"] == plural and crd["metadata"]["name"] == plural + ".serving.kserve.io",
                kind + ": plural/name must be " + plural,
            )
            expect(spec["scope"] == scope, kind + ": scope must be " + scope)
            vs = [v for v in spec["versions"] if v["name"] == "v1alpha1"]
            expect(len(vs) == 1 and vs[0]["served"] and vs[0]["storage"], kind + ": v1alpha1 must be served and stored")
            schema = vs[0]["schema"]["openAPIV3Schema"]
            structural(schema)
            out[kind] = jsonschema.Draft4Validator(pruning(schema))
    expect(sorted(out) == sorted(CRD_EXPECT), f"CRDs found: {sorted(out)}")
    return out


def test_kserve_example_objects_validate(validators, corpus) -> None:
    path = corpus / "kserve" / "localmodelcache_readme_objects.yaml"
    objs = [o for o in load(str(path)) if o.get("apiVersion") == "serving.kserve.io/v1alpha1"]
    assert len(objs) >= 4, f"expected the KServe guide's cache objects in {path}"
    for o in objs:
        errs = [e.message for e in validators[o["kind"]].iter_errors(o)]
        assert not errs, f"KServe's {o['kind']} {o['metadata']['name']} does not validate: {errs}"


def test_a_valid_namespace_cache_with_a_newer_field_is_accepted(validators) -> None:
    good = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNamespaceCache",
        "metadata": {"name": "m", "namespace": "team-a"},
        "spec": {"sourceModelUri": "hf://org/m", "modelSize": "10Gi", "nodeGroups": ["workers"],
                 "someNewerKServeField": {"kept": True}},
    }  # fmt: skip
    assert validators["LocalModelNamespaceCache"].is_valid(good)


BAD_SPECS = {
    "no sourceModelUri": {"modelSize": "1Gi", "nodeGroups": ["w"]},
    "no modelSize (required by KServe)": {"sourceModelUri": "s3://b/m", "nodeGroups": ["w"]},
    "no nodeGroups": {"sourceModelUri": "s3://b/m", "modelSize": "1Gi"},
    "empty sourceModelUri": {"sourceModelUri": "", "modelSize": "1Gi", "nodeGroups": ["w"]},
    "empty nodeGroups": {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": []},
    "nodeGroups a string": {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": "w"},
    "modelSize not a quantity": {"sourceModelUri": "s3://b/m", "modelSize": "ten gigs", "nodeGroups": ["w"]},
    "storage.parameters not strings": {"sourceModelUri": "s3://b/m", "modelSize": "1Gi", "nodeGroups": ["w"],
                                       "storage": {"parameters": {"region": 1}}},
}  # fmt: skip


@pytest.mark.parametrize("what", sorted(BAD_SPECS))
@pytest.mark.parametrize("kind", ["LocalModelCache", "LocalModelNamespaceCache"])
def test_malformed_caches_are_refused(validators, kind: str, what: str) -> None:
    obj = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": kind, "metadata": {"name": "x"}, "spec": BAD_SPECS[what]}
    assert not validators[kind].is_valid(obj), f"{kind} with {what} is accepted"


def test_node_group_without_persistent_volume_claim_spec_is_refused(validators) -> None:
    ng = {"apiVersion": "serving.kserve.io/v1alpha1", "kind": "LocalModelNodeGroup", "metadata": {"name": "w"},
          "spec": {"storageLimit": "1Ti", "persistentVolumeSpec": {}}}  # fmt: skip
    assert not validators["LocalModelNodeGroup"].is_valid(ng)


def test_chart_crds_are_manifests_crds(assets: Assets) -> None:
    """Files identical, rendered spec equal, kept on uninstall (crds.keep defaults to true)."""
    files = crd_files(str(assets.manifests / "crds"), "*.serving.kserve.io.yaml")
    copies = crd_files(str(assets.chart / "files" / "crds"))
    assert [p.rsplit("/", 1)[1] for p in files] == [p.rsplit("/", 1)[1] for p in copies], "different CRD sets"
    for f, c in zip(files, copies, strict=True):
        assert filecmp.cmp(f, c, shallow=False), f"{c} differs from {f} (copy it)"
    rendered = {
        d["metadata"]["name"]: d
        for d in of_kind(
            load(str(assets.render("certmanager", "--set", "certManager.enabled=true,crds.install=true"))), "CustomResourceDefinition"
        )
        if d["metadata"]["name"].endswith(".serving.kserve.io")
    }
    originals = {d["metadata"]["name"]: d for p in files for d in load(p)}
    assert sorted(rendered) == sorted(originals)
    for name, d in originals.items():
        assert rendered[name]["spec"] == d["spec"], name + ": the chart's spec differs from manifests/crds"
        ann = rendered[name]["metadata"].get("annotations") or {}
        assert ann.get("helm.sh/resource-policy") == "keep", name + ": helm.sh/resource-policy: keep missing"


# --- ModelgateException (docs/exceptions.md) ------------------------------------------------------

EXCEPTION_CRD = "modelgateexceptions.modelgate.io.yaml"


def good_exception() -> dict:
    return {
        "apiVersion": "modelgate.io/v1alpha1",
        "kind": "ModelgateException",
        "metadata": {"name": "vendor-root", "namespace": "team-a"},
        "spec": {
            "reason": "the vendor image runs as root until its 2.0",
            "expires": "2027-01-01T00:00:00Z",
            "rules": ["non-root"],
            "selector": {"matchLabels": {"app": "vendor"}},
            "containers": ["vendor"],
            "images": ["registry.example/vendor@sha256:abc", "registry.example/vendor:2.*"],
        },
    }


@pytest.fixture(scope="module")
def exception_schema(assets: Assets) -> dict:
    [crd] = load(str(assets.manifests / "base" / EXCEPTION_CRD))
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "modelgateexceptions.modelgate.io"
    assert (spec["group"], spec["scope"], spec["names"]["kind"], spec["names"]["plural"]) == (
        "modelgate.io", "Namespaced", "ModelgateException", "modelgateexceptions",
    )  # fmt: skip
    assert spec["names"]["shortNames"] == ["mgex"]
    [v] = spec["versions"]
    assert v["name"] == "v1alpha1" and v["served"] and v["storage"]
    assert [c["name"] for c in v["additionalPrinterColumns"]] == ["Rules", "Expires", "In force", "Why", "Age"]
    schema = v["schema"]["openAPIV3Schema"]
    structural(schema)
    return schema


def cel_failures(schema: dict, value) -> list[str]:
    """The messages of the x-kubernetes-validations rules that `value` breaks, evaluated where the
    API server evaluates them (each rule with `self` bound to its node)."""
    out = []
    for rule in schema.get("x-kubernetes-validations", []):
        result = cel.evaluate(rule["rule"], {"self": value})
        assert isinstance(result, bool), rule
        if not result:
            out.append(rule["message"])
    if isinstance(value, dict):
        for k, sub in (schema.get("properties") or {}).items():
            if k in value:
                out += cel_failures(sub, value[k])
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            out += cel_failures(schema["items"], item)
    return out


def test_the_chart_ships_the_manifests_exception_crd(assets: Assets) -> None:
    assert filecmp.cmp(assets.manifests / "base" / EXCEPTION_CRD, assets.chart / "files" / "exceptions" / EXCEPTION_CRD, shallow=False), (
        "the chart's copy of the ModelgateException CRD differs (copy it)"
    )


def test_a_good_exception_is_accepted(exception_schema) -> None:
    good = good_exception()
    errs = [e.message for e in jsonschema.Draft4Validator(pruning(exception_schema)).iter_errors(good)]
    assert not errs
    assert cel_failures(exception_schema, good) == []
    good["spec"]["selector"] = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["vendor"]}]}
    assert cel_failures(exception_schema, good) == []


@pytest.mark.parametrize(
    ("what", "path", "value"),
    [
        ("no reason", ("reason",), None),
        ("an empty reason", ("reason",), ""),
        ("a reason too long", ("reason",), "x" * 1025),
        ("no expiry", ("expires",), None),
        ("no rules", ("rules",), None),
        ("empty rules", ("rules",), []),
        ("an unknown rule", ("rules",), ["privileged"]),
        ("no selector", ("selector",), None),
        ("an unknown operator", ("selector",), {"matchExpressions": [{"key": "a", "operator": "Has"}]}),
        ("empty containers", ("containers",), []),
        ("an empty image", ("images",), [""]),
    ],
)
def test_malformed_exceptions_are_refused_by_the_schema(exception_schema, what, path, value) -> None:
    bad = good_exception()
    if value is None:
        del bad["spec"][path[0]]
    else:
        bad["spec"][path[0]] = value
    assert not jsonschema.Draft4Validator(pruning(exception_schema)).is_valid(bad), what


@pytest.mark.parametrize(
    ("what", "field", "value", "message"),
    [
        ("a blank reason", "reason", "   ", "spec.reason must not be blank"),
        ("an empty selector", "selector", {}, "spec.selector must pin a label"),
        ("empty matchLabels", "selector", {"matchLabels": {}}, "spec.selector must pin a label"),
        (
            "a selector that matches everything with a label",
            "selector",
            {"matchExpressions": [{"key": "x", "operator": "Exists"}]},
            "spec.selector must pin a label",
        ),
        (
            "a NotIn selector",
            "selector",
            {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["a"]}]},
            "spec.selector must pin a label",
        ),
        ("In without values", "selector", {"matchExpressions": [{"key": "app", "operator": "In"}]}, "In and NotIn need values"),
        ("a * inside an image", "images", ["registry.example/*/vendor"], "a * may only be"),
        ("two *", "images", ["registry.example/vendor**"], "a * may only be"),
    ],
)
def test_what_needs_no_clock_is_refused_by_the_crds_rules(exception_schema, what, field, value, message) -> None:
    bad = good_exception()
    bad["spec"][field] = value
    failures = cel_failures(exception_schema, bad)
    assert any(f.startswith(message) for f in failures), f"{what}: {failures}"
