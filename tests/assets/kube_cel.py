"""kube-apiserver's own CEL for the webhooks' matchConditions, offline.

The static binaries of the `kube-cel` input (scripts/inputs.sh resolves them into
$MODELGATE_INPUTS_DIR/kube-cel, default .inputs/kube-cel; MODELGATE_KUBE_CEL_DIR names another
directory, as for the Rust tests; their README.md says how they run) compile a
ValidatingAdmissionPolicy with k8s.io/apiserver's CEL compiler of one kube-apiserver minor version
(VERSIONS) and evaluate it on case files.

How a case is decided (`webhook_called`): the webhook's matchConditions become the
`spec.matchConditions` of a policy whose one validation is `false` with the message CALLED. The
binary evaluates them with the matchConditions cost budget (2 500 000) and the rule kube-apiserver's
webhook dispatcher applies:
- a condition is false: the policy is not applied (`NOT MATCHED (matchCondition i false)`), the
  webhook is skipped;
- every condition is true: the validation denies with CALLED, the webhook is called;
- a condition fails to evaluate and none is false: the failurePolicy decides (`DENY (failurePolicy
  Fail, matchCondition error)`); here that is an error, never a skip.
A second policy, run on the same cases, has no matchConditions and each condition as a validation:
it tells what every condition evaluated to, so that an error hidden behind another condition's
false (kube-apiserver skips the webhook then; the error would surface on some other request) is
reported too. The two runs must agree. The policy is compiled once per run (as created, and as
stored: an error in either fails), every case of it evaluated in that one process.

The environment of a webhook's matchConditions is the one kube-apiserver compiles a policy's in
(the same CEL libraries per compatibility version, `object`, `oldObject`, `request` typed as an
AdmissionRequest, `authorizer`), less three variables a policy has and a webhook has not:
`namespaceObject`, `variables` and `params`. A condition naming one compiles here but is refused by
kube-apiserver in a webhook configuration, so `check_webhook_environment` refuses it before anything
runs (and the cases bind `namespaceObject` to null). `authorizer` is declared but not bound by the
binaries: a condition that calls it fails to evaluate here.

`request` must be bound as kube-apiserver binds it (an AdmissionRequest converted to unstructured
JSON): `admission_request` leaves out every omitempty field that is empty (`subResource` on the main
resource, `namespace` of a cluster-scoped object, `name` before one is generated, an empty
`userInfo.username`), so a condition that reads one without optional access fails as it would in
the API server.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIR_ENV = "MODELGATE_KUBE_CEL_DIR"
# Set (to anything): the policies and case files are left in place, and their directory printed.
KEEP_ENV = "MODELGATE_KUBE_CEL_KEEP"
# The message of the policy's one validation: the webhook would be called.
CALLED = "matchConditions all true: the webhook is called"


@dataclass(frozen=True)
class Version:
    label: str
    binary: str
    # STRICT=1: strict cost, as a 1.32 cluster always runs it (vap136 always does; 1.30 and 1.31
    # run without it by default).
    strict: bool = False

    def __str__(self) -> str:
        return self.label


VERSIONS = (
    Version("1.30", "vap130"),
    Version("1.31", "vap131"),
    Version("1.32", "vap132", strict=True),
    Version("1.36", "vap136"),
)


class KubeCelError(AssertionError):
    """The evaluator could not decide: a compile error, output it cannot read, runs that disagree."""


def tools_dir() -> Path:
    """$MODELGATE_KUBE_CEL_DIR, else kube-cel in the inputs scripts/inputs.sh resolves
    ($MODELGATE_INPUTS_DIR, default .inputs, relative to the repository). Fails when a binary is
    missing."""
    inputs = REPO / os.environ.get("MODELGATE_INPUTS_DIR", ".inputs")
    path = Path(os.environ[DIR_ENV]) if os.environ.get(DIR_ENV) else inputs / "kube-cel"
    absent = [v.binary for v in VERSIONS if not (path / v.binary).is_file()]
    if absent:
        raise KubeCelError(
            f"kube-apiserver's CEL evaluator is missing: {', '.join(absent)} not in {path} "
            f"(scripts/inputs.sh kube-cel resolves it; or set {DIR_ENV} to its directory)"
        )
    return path


# --- what the API server binds ----------------------------------------------------------------------


def admission_request(
    group: str,
    version: str,
    kind: str,
    resource: str,
    operation: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    sub_resource: str | None = None,
    username: str | None = None,
    groups: list[str] | None = None,
) -> dict:
    """An AdmissionRequest as kube-apiserver binds it to `request` (CreateAdmissionRequest, then the
    unstructured converter): an omitempty field that is empty is absent, not "". `requestKind`,
    `requestResource` and `requestSubResource` are the request's own (no conversion between
    versions); `object`, `oldObject` and `options` are null in `request` (the objects are bound to
    their own variables)."""
    gvk = {"group": group, "version": version, "kind": kind}
    gvr = {"group": group, "version": version, "resource": resource}
    req: dict = {"uid": "", "kind": gvk, "resource": gvr, "requestKind": dict(gvk), "requestResource": dict(gvr)}
    if sub_resource:
        req["subResource"] = sub_resource
        req["requestSubResource"] = sub_resource
    if name:
        req["name"] = name
    if namespace:
        req["namespace"] = namespace
    req["operation"] = operation
    user: dict = {}
    if username:
        user["username"] = username
    if groups:
        user["groups"] = list(groups)
    req |= {"userInfo": user, "object": None, "oldObject": None, "dryRun": False, "options": None}
    return req


# --- the webhook's environment ----------------------------------------------------------------------

# Variables of a policy that a webhook's matchConditions do not have.
NOT_IN_WEBHOOKS = ("namespaceObject", "variables", "params")
_STRING = re.compile(r"""[rR]?[bB]?[rR]?('''.*?'''|\"\"\".*?\"\"\"|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""", re.S)
_POLICY_ONLY = re.compile(r"(?<![\w.])(" + "|".join(NOT_IN_WEBHOOKS) + r")\b")


def check_webhook_environment(conditions: list[dict]) -> None:
    """Each condition has a name and an expression, and names no variable a webhook lacks (outside
    string literals; a field of that name, `object.spec.params`, is fine)."""
    names = [c.get("name") for c in conditions]
    if len(set(names)) != len(names) or not all(names):
        raise KubeCelError(f"matchConditions need unique, non-empty names: {names}")
    for c in conditions:
        if not isinstance(c.get("expression"), str):
            raise KubeCelError(f"matchCondition {c.get('name')} has no expression")
        found = sorted(set(_POLICY_ONLY.findall(_STRING.sub("''", c["expression"]))))
        if found:
            raise KubeCelError(
                f"matchCondition {c['name']} reads {', '.join(found)}: a policy's variable(s) that a webhook's "
                "matchConditions do not have (kube-apiserver refuses the webhook configuration)"
            )


# --- running --------------------------------------------------------------------------------------


@dataclass
class Verdict:
    """One case in one version."""

    # kube-apiserver's decision: the webhook is called (True), skipped (False), or None when a
    # condition failed to evaluate and none was false (its failurePolicy decides).
    called: bool | None
    # Why it is not a clean decision: the matchCondition error, or a condition that failed to
    # evaluate behind another one's false. None when every condition evaluated to a bool.
    error: str | None
    # What each condition evaluated to (None: it failed), from the second policy.
    conditions: dict[str, bool | None] = field(default_factory=dict)
    # The case's block of the binary's output (both runs).
    raw: str = ""


@dataclass
class _Run:
    version: Version
    compile_seconds: float
    blocks: dict[str, list[str]]  # case file -> the decision lines
    output: str


def _go_seconds(text: str) -> float:
    units = {"ns": 1e-9, "µs": 1e-6, "μs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"([0-9.]+)(ns|µs|μs|us|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise KubeCelError(f"not a Go duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def _run(tools: Path, version: Version, policy: Path, cases: list[Path]) -> _Run:
    """One process of `version` on the policy and every case; its output, read."""
    binary = tools / version.binary
    env = {"STRICT": "1"} if version.strict else {}
    r = subprocess.run([str(binary), str(policy), *map(str, cases)], capture_output=True, text=True, env=env, timeout=600)
    out = r.stdout
    if r.returncode != 0:
        raise KubeCelError(f"{binary} exited {r.returncode}:\n{r.stderr}\n{out}")

    def fail(what: str):
        raise KubeCelError(f"{version} ({version.binary}) on {policy.name}: {what}\n--- output ---\n{out}")

    header = False
    compiles: list[float] = []
    errors: list[str] = []
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    in_decision = False
    compile_line = re.compile(
        r"-- (create-time compile \(NewExpressions\)|runtime compile \(StoredExpressions\)) took (\S+): (\d+) errors?"
    )
    for line in out.splitlines():
        text = line.strip()
        if not text:
            continue
        if line.startswith("== "):
            if not line[3:].startswith(version.label + " "):
                fail(f"not the output of {version}: {line}")
            header = True
        elif m := compile_line.fullmatch(line):
            compiles.append(_go_seconds(m[2]))
            if int(m[3]):
                errors.append(line)
            current = None
        elif line.startswith("-- case "):
            m = re.fullmatch(r"-- case .* \(([^()]+)\)", line)
            if not m:
                fail(f"a case line: {line}")
            current = blocks.setdefault(Path(m[1]).name, [])
            in_decision = False
        elif current is None:
            # Under a compile: the slow expressions' times, the errors (and the lines of an
            # error's caret diagram).
            if text.startswith("ERROR") or line.startswith(" | "):
                errors.append(text)
            elif not text.startswith("compile "):
                fail(f"an unknown line: {line}")
        elif text.startswith("decision: "):
            if in_decision:
                fail(f"two decisions: {line}")
            in_decision = True
            current.append(text.removeprefix("decision: "))
        elif in_decision:
            if text.startswith("validation "):
                current.append(text)
            else:
                current[-1] += "\n" + line  # a message of several lines
    if not header or len(compiles) != 2:
        fail("no version header, or not two compiles")
    if errors:
        raise KubeCelError(f"the policy {policy.name} does not compile in kube-apiserver {version}:\n" + "\n".join(errors))
    return _Run(version, sum(compiles), blocks, out)


_NOT_MATCHED = re.compile(r"NOT MATCHED \(matchCondition (\d+) false\) -> ADMIT")
_VALIDATION = re.compile(r"validation (\d+) (DENY: |ERROR -> DENY \(Fail\): )(.*)", re.S)


def _gate(decision: list[str], conditions: list[dict]) -> tuple[bool | None, str | None]:
    """The matchConditions policy's decision: (called, error)."""
    if not decision:
        raise KubeCelError("a case without a decision")
    first = decision[0]
    if len(decision) == 1 and first == f"validation 0 DENY: {CALLED}":
        return True, None
    if len(decision) == 1 and (m := _NOT_MATCHED.fullmatch(first)):
        if int(m[1]) >= len(conditions):
            raise KubeCelError(f"no matchCondition {m[1]}: {first}")
        return False, None
    if len(decision) == 1 and first.startswith("DENY (failurePolicy Fail, matchCondition error): "):
        return None, first
    raise KubeCelError(f"an unknown decision: {decision}")


def _each(decision: list[str], conditions: list[dict]) -> dict[str, bool | None] | str:
    """The per-condition policy's decision: what each condition evaluated to, or the reason it
    cannot tell (the whole evaluation's budget spent)."""
    values: dict[str, bool | None] = {c["name"]: True for c in conditions}
    if decision == ["ADMIT"]:
        return values
    if len(decision) == 1 and decision[0].startswith("DENY (failurePolicy Fail)"):
        return decision[0]
    for line in decision:
        m = _VALIDATION.fullmatch(line)
        if not m or int(m[1]) >= len(conditions):
            raise KubeCelError(f"an unknown decision: {decision}")
        values[conditions[int(m[1])]["name"]] = False if m[2] == "DENY: " else None
    return values


def _policy(name: str, conditions: list[dict], gate: bool) -> dict:
    spec: dict = {"failurePolicy": "Fail"}
    if gate:
        spec |= {"matchConditions": conditions, "validations": [{"expression": "false", "message": CALLED}]}
    else:
        spec["validations"] = [{"expression": c["expression"], "message": f"{c['name']} is false"} for c in conditions]
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy", "metadata": {"name": name}, "spec": spec}


@dataclass
class Job:
    """One webhook's matchConditions and the cases to decide, in every version of `versions`."""

    name: str
    conditions: list[dict]
    # case name -> {"object": …, "oldObject": …, "request": …} (request as admission_request binds it)
    cases: dict[str, dict]
    versions: tuple[Version, ...] = VERSIONS


@dataclass
class Result:
    # (version label, case name) -> Verdict
    verdicts: dict[tuple[str, str], Verdict]
    # (version label, "gate" | "each") -> seconds the two compiles took, as the binary measured
    compile_seconds: dict[tuple[str, str], float]


def webhook_called(jobs: list[Job], workers: int | None = None) -> dict[str, Result]:
    """Decides every case of every job in every version of its job: two processes per job and
    version (the matchConditions policy and the per-condition one), at most `workers` (default:
    the CPUs) at a time. Returns each job's Result by its name. Raises KubeCelError when a policy
    does not compile or the output cannot be read."""
    tools = tools_dir()
    for job in jobs:
        check_webhook_environment(job.conditions)
    keep = bool(os.environ.get(KEEP_ENV))
    work = Path(tempfile.mkdtemp(prefix="kube-cel-"))
    try:
        runs: dict[tuple[str, str, str], concurrent.futures.Future] = {}
        files: dict[str, dict[str, str]] = {}
        with concurrent.futures.ThreadPoolExecutor(workers or os.cpu_count() or 2) as pool:
            for j, job in enumerate(jobs):
                d = work / f"{j:02d}-{re.sub(r'[^A-Za-z0-9.-]+', '-', job.name)}"
                (d / "cases").mkdir(parents=True)
                width = max(5, len(str(len(job.cases))))
                files[job.name] = {}
                for i, (name, ctx) in enumerate(job.cases.items()):
                    f = d / "cases" / f"case-{i:0{width}d}.json"
                    f.write_text(
                        json.dumps(
                            {
                                "name": " ".join(name.split()),
                                "object": ctx.get("object"),
                                "oldObject": ctx.get("oldObject"),
                                "request": ctx["request"],
                                "namespaceObject": None,
                            }
                        )
                    )
                    files[job.name][name] = f.name
                case_files = sorted((d / "cases").iterdir())
                for kind in ("gate", "each"):
                    policy = d / f"{kind}.json"
                    policy.write_text(json.dumps(_policy(job.name, job.conditions, kind == "gate")))
                    for v in job.versions:
                        runs[(job.name, v.label, kind)] = pool.submit(_run, tools, v, policy, case_files)
            done = {k: f.result() for k, f in runs.items()}
        results = {}
        for job in jobs:
            verdicts, compile_seconds = {}, {}
            for v in job.versions:
                gate, each = done[(job.name, v.label, "gate")], done[(job.name, v.label, "each")]
                compile_seconds[(v.label, "gate")] = gate.compile_seconds
                compile_seconds[(v.label, "each")] = each.compile_seconds
                for name, file in files[job.name].items():
                    verdicts[(v.label, name)] = _verdict(job, v, name, gate.blocks.get(file), each.blocks.get(file))
            results[job.name] = Result(verdicts, compile_seconds)
        return results
    finally:
        if keep:
            print(f"{KEEP_ENV}: the policies and their cases are in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def _verdict(job: Job, version: Version, name: str, gate: list[str] | None, each: list[str] | None) -> Verdict:
    where = f"{job.name}, kube-apiserver {version}, case {name!r}"
    if gate is None or each is None:
        raise KubeCelError(f"{where}: not evaluated")
    raw = "matchConditions: " + "\n".join(gate) + "\neach condition: " + "\n".join(each)
    try:
        called, error = _gate(gate, job.conditions)
        values = _each(each, job.conditions)
    except KubeCelError as e:
        raise KubeCelError(f"{where}: {e}") from None
    if isinstance(values, str):
        return Verdict(called, error or values, {}, raw)
    failed = [n for n, v in values.items() if v is None]
    if called is not None and called != all(values.values()):
        raise KubeCelError(f"{where}: the two runs disagree:\n{raw}")
    if called is None and not failed:
        # The gate's budget (2 500 000 for all conditions) is smaller than the validations'.
        return Verdict(None, error, values, raw)
    if failed and error is None:
        error = f"{', '.join(failed)} failed to evaluate (behind another condition's false):\n{raw}"
    return Verdict(called, error, values, raw)
