"""Reading rendered Kubernetes objects: YAML streams, kinds, label selectors, CRD schemas."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from typing import Any

import jsonschema
import yaml

Obj = dict[str, Any]


def expect(cond: object, msg: str) -> None:
    """An assertion that survives `python -O` and reads as the rule it checks."""
    if not cond:
        raise AssertionError(msg)


def load(path: str) -> list[Obj]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def of_kind(docs: Iterable[Obj], kind: str) -> list[Obj]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: Iterable[Obj], kind: str) -> Obj:
    found = of_kind(docs, kind)
    expect(len(found) == 1, f"expected exactly one {kind}, found {len(found)}")
    return found[0]


def named(docs: Iterable[Obj], kind: str, name: str) -> Obj:
    found = [d for d in of_kind(docs, kind) if d["metadata"]["name"] == name]
    expect(len(found) == 1, f"expected one {kind} {name}, found {len(found)}")
    return found[0]


def selector_matches(sel: Obj, labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics."""
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and k in labels and labels[k] in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def flat_rules(rules: list[Obj]) -> list[tuple[str, str, str, str]]:
    """A webhook's rules as sorted (group, version, operation, resource) tuples."""
    return sorted(
        (g, v, o, res) for r in rules for g in r["apiGroups"] for v in r["apiVersions"] for o in r["operations"] for res in r["resources"]
    )


def structural(schema: Obj, where: str = "openAPIV3Schema") -> None:
    """A few rules of structural schemas: every node typed (or int-or-string / preserve-unknown)."""
    if schema.get("x-kubernetes-int-or-string"):
        return
    expect("type" in schema or schema.get("x-kubernetes-preserve-unknown-fields"), where + ": no type")
    for k, sub in (schema.get("properties") or {}).items():
        structural(sub, where + "." + k)
    if isinstance(schema.get("items"), dict):
        structural(schema["items"], where + "[]")
    if isinstance(schema.get("additionalProperties"), dict):
        structural(schema["additionalProperties"], where + "{}")


def pruning(schema: Obj) -> Obj:
    """An openAPIV3Schema as JSON schema that also refuses the fields the API server would prune
    (objects with properties and no x-kubernetes-preserve-unknown-fields): strict validation."""
    s = {k: v for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if "properties" in s:
        s["properties"] = {k: pruning(v) for k, v in s["properties"].items()}
        if not schema.get("x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in s:
            s["additionalProperties"] = False
    if isinstance(s.get("items"), dict):
        s["items"] = pruning(s["items"])
    if isinstance(s.get("additionalProperties"), dict):
        s["additionalProperties"] = pruning(s["additionalProperties"])
    return s


def crd_validators(paths: Iterable[str]) -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """Strict validators keyed by (apiVersion, kind) for every served version of the CRDs."""
    out = {}
    for p in paths:
        for crd in load(p):
            expect(crd["kind"] == "CustomResourceDefinition", p + ": not a CRD")
            spec = crd["spec"]
            for v in spec["versions"]:
                if not v.get("served"):
                    continue
                schema = v["schema"]["openAPIV3Schema"]
                key = (spec["group"] + "/" + v["name"], spec["names"]["kind"])
                out[key] = jsonschema.Draft4Validator(pruning(schema))
    return out


def crd_files(directory: str, pattern: str = "*.yaml") -> list[str]:
    return sorted(glob.glob(os.path.join(directory, pattern)))


def deployment_container(docs: list[Obj]) -> tuple[Obj, Obj]:
    d = one(docs, "Deployment")
    cs = d["spec"]["template"]["spec"]["containers"]
    expect(len(cs) == 1, "expected one container in the Deployment")
    return d, cs[0]


def flag_of_env(name: str) -> str:
    """MODELGATE_RUN_AS_USER -> --run-as-user (every flag is also an env var MODELGATE_<NAME>)."""
    return "--" + name[len("MODELGATE_") :].lower().replace("_", "-")


def policy_flags(docs: list[Obj]) -> dict[str, str]:
    """The flags in force: MODELGATE_* from envFrom ConfigMaps and env, then literal arguments."""
    _, c = deployment_container(docs)
    flags: dict[str, str] = {}
    cms = {cm["metadata"]["name"]: cm for cm in of_kind(docs, "ConfigMap")}
    for src in c.get("envFrom") or []:
        ref = src.get("configMapRef")
        if ref:
            expect(ref["name"] in cms, "envFrom names a ConfigMap that is not rendered: " + ref["name"])
            for k, v in cms[ref["name"]].get("data", {}).items():
                if k.startswith("MODELGATE_"):
                    flags[flag_of_env(k)] = str(v)
    for e in c.get("env") or []:
        if e["name"].startswith("MODELGATE_") and "value" in e:
            flags[flag_of_env(e["name"])] = str(e["value"])
    for a in c.get("args") or []:
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            flags[k] = v
    return flags
