//! kube-apiserver's own ValidatingAdmissionPolicy compiler and evaluator, offline: the static
//! binaries of `.inputs/kube-cel`, resolved by `scripts/inputs.sh` (its README: usage, case
//! files, output), one per minor version of the API server. [`evaluate`] writes a policy and its
//! cases to a temporary directory, runs every version of [`VERSIONS`] on them (each its own
//! process, at most [`MAX_PROCESSES`] at a time in the whole test binary) and parses what each
//! decided.
//!
//! The contract the tests rely on:
//! - a compile error of the policy (as created, or as stored) in any version fails the test,
//!   naming the version and the expression;
//! - each case gets one [`Decision`] per version; [`Outcome::agreed`] is the decision when every
//!   version decided the same and no message was dropped (a `messageExpression` result over
//!   5 KiB, which the API server replaces by the static message), else what differs;
//! - output that cannot be read, or a case without a decision, fails the test with the output.
//!
//! `request` and `namespaceObject` must be bound as the API server binds them: use
//! [`AdmissionRequest`] and [`namespace_object`].
#![allow(dead_code)]

// The project's convention for what a test needs from outside (also loaded by `common/cli.rs`).
#[allow(clippy::duplicate_mod)]
#[path = "../common/required.rs"]
mod required;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

/// Where the binaries are, when `MODELGATE_KUBE_CEL_DIR` does not say.
pub const DIR_ENV: &str = "MODELGATE_KUBE_CEL_DIR";

/// Set (to anything), [`evaluate`] leaves the policy and case files it writes in place and
/// prints where they are.
pub const KEEP_ENV: &str = "MODELGATE_KUBE_CEL_KEEP";

/// The directory of one evaluation's files.
enum Kept {
    Temp(tempfile::TempDir),
    Dir(PathBuf),
}

impl Kept {
    fn path(&self) -> &Path {
        match self {
            Kept::Temp(t) => t.path(),
            Kept::Dir(d) => d,
        }
    }
}

/// The files of one run: the policy, then each case (`case-NNNNN.json`, in the order given),
/// in a temporary directory that lives as long as this (kept with [`KEEP_ENV`]).
struct Inputs {
    dir: Kept,
    policy: PathBuf,
    cases: Vec<PathBuf>,
}

fn write_inputs(policy_file: &str, policy: &Value, cases: &[Case]) -> Inputs {
    let work = tempfile::tempdir().expect("a temporary directory");
    // To run the binaries on these files by hand: `MODELGATE_KUBE_CEL_KEEP=1` keeps them.
    let dir = if std::env::var_os(KEEP_ENV).is_some() {
        let kept = work.keep();
        println!(
            "{KEEP_ENV}: the policy and its cases are in {}",
            kept.display()
        );
        Kept::Dir(kept)
    } else {
        Kept::Temp(work)
    };
    let policy_path = dir.path().join(policy_file);
    std::fs::write(&policy_path, serde_json::to_vec(policy).unwrap()).unwrap();
    let width = cases.len().to_string().len().max(5);
    let cases = cases
        .iter()
        .enumerate()
        .map(|(i, case)| {
            let path = dir.path().join(format!("case-{i:0width$}.json"));
            std::fs::write(&path, serde_json::to_vec(&case.to_json()).unwrap()).unwrap();
            path
        })
        .collect();
    Inputs {
        dir,
        policy: policy_path,
        cases,
    }
}

/// One API server version: its binary and the environment a cluster of that version runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Version {
    pub label: &'static str,
    pub binary: &'static str,
    /// `STRICT=1`: strict cost, as a 1.32 cluster always runs it (`vap136` always does).
    pub strict: bool,
}

/// The versions a policy is evaluated with.
pub const VERSIONS: [Version; 4] = [
    Version {
        label: "1.30",
        binary: "vap130",
        strict: false,
    },
    Version {
        label: "1.31",
        binary: "vap131",
        strict: false,
    },
    Version {
        label: "1.32",
        binary: "vap132",
        strict: true,
    },
    Version {
        label: "1.36",
        binary: "vap136",
        strict: false,
    },
];

/// At most this many evaluator processes at once, over every test of the binary.
pub const MAX_PROCESSES: usize = 2;

/// The directory of the binaries: `$MODELGATE_KUBE_CEL_DIR`, else `kube-cel` in the inputs that
/// `scripts/inputs.sh` resolves (`$MODELGATE_INPUTS_DIR`, default `.inputs`, relative to the
/// repository). `None` (the test is skipped) when a binary is missing, a failure under
/// `MODELGATE_REQUIRE_TOOLS=1`.
pub fn tools_dir() -> Option<PathBuf> {
    let dir = match std::env::var_os(DIR_ENV) {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(std::env::var_os("MODELGATE_INPUTS_DIR").unwrap_or_else(|| ".inputs".into()))
            .join("kube-cel"),
    };
    let absent: Vec<&str> = VERSIONS
        .iter()
        .map(|v| v.binary)
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if absent.is_empty() {
        Some(dir)
    } else {
        required::missing(&format!(
            "kube-apiserver's CEL evaluator ({} in {}; scripts/inputs.sh resolves it, or set {DIR_ENV} to its directory)",
            absent.join(", "),
            dir.display()
        ));
        None
    }
}

// ---------------------------------------------------------------------------------------------
// What the API server binds
// ---------------------------------------------------------------------------------------------

/// The requesting user; empty fields are left out, as the API server's conversion does.
#[derive(Clone, Debug, Default)]
pub struct UserInfo {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// An AdmissionRequest as kube-apiserver binds it to `request`: built by
/// `CreateAdmissionRequest` and converted to unstructured JSON, so that every `omitempty` field
/// that is empty is absent. `requestKind`/`requestResource`/`requestSubResource` are the
/// request's own (no conversion between versions).
#[derive(Clone, Debug, Default)]
pub struct AdmissionRequest {
    pub group: String,
    pub version: String,
    pub kind: String,
    /// The resource (plural), without the subresource.
    pub resource: String,
    /// `None` (or empty) on the main resource.
    pub sub_resource: Option<String>,
    /// `None` (or empty) when the object has no name yet.
    pub name: Option<String>,
    /// `None` for a cluster-scoped object.
    pub namespace: Option<String>,
    pub operation: String,
    pub user: UserInfo,
}

impl AdmissionRequest {
    pub fn to_json(&self) -> Value {
        let gvk = json!({"group": self.group, "version": self.version, "kind": self.kind});
        let gvr = json!({"group": self.group, "version": self.version, "resource": self.resource});
        let mut r = Map::new();
        r.insert("uid".into(), json!(""));
        r.insert("kind".into(), gvk.clone());
        r.insert("resource".into(), gvr.clone());
        r.insert("requestKind".into(), gvk);
        r.insert("requestResource".into(), gvr);
        let present = |s: &Option<String>| s.as_deref().filter(|s| !s.is_empty()).map(String::from);
        if let Some(sub) = present(&self.sub_resource) {
            r.insert("subResource".into(), json!(sub));
            r.insert("requestSubResource".into(), json!(sub));
        }
        if let Some(name) = present(&self.name) {
            r.insert("name".into(), json!(name));
        }
        if let Some(namespace) = present(&self.namespace) {
            r.insert("namespace".into(), json!(namespace));
        }
        r.insert("operation".into(), json!(self.operation));
        let mut user = Map::new();
        if !self.user.username.is_empty() {
            user.insert("username".into(), json!(self.user.username));
        }
        if !self.user.uid.is_empty() {
            user.insert("uid".into(), json!(self.user.uid));
        }
        if !self.user.groups.is_empty() {
            user.insert("groups".into(), json!(self.user.groups));
        }
        if !self.user.extra.is_empty() {
            user.insert("extra".into(), json!(self.user.extra));
        }
        r.insert("userInfo".into(), Value::Object(user));
        r.insert("object".into(), Value::Null);
        r.insert("oldObject".into(), Value::Null);
        r.insert("dryRun".into(), json!(false));
        r.insert("options".into(), Value::Null);
        Value::Object(r)
    }
}

/// The request's Namespace as the API server trims it for `namespaceObject`: its metadata
/// (name, and its labels with the `kubernetes.io/metadata.name` label every namespace carries),
/// no `apiVersion`/`kind`. A cluster-scoped request has `null` instead.
pub fn namespace_object(name: &str, labels: &BTreeMap<String, String>) -> Value {
    let mut labels = labels.clone();
    labels
        .entry("kubernetes.io/metadata.name".into())
        .or_insert_with(|| name.to_string());
    json!({"metadata": {"name": name, "labels": labels}})
}

/// One admission request to evaluate.
#[derive(Clone, Debug)]
pub struct Case {
    /// A label for the output and the reports (one line).
    pub name: String,
    pub object: Value,
    /// `Value::Null` on CREATE.
    pub old_object: Value,
    /// [`AdmissionRequest::to_json`].
    pub request: Value,
    /// [`namespace_object`], or `Value::Null` for a cluster-scoped object.
    pub namespace_object: Value,
}

impl Case {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name.replace(['\n', '\r'], " "),
            "object": self.object,
            "oldObject": self.old_object,
            "request": self.request,
            "namespaceObject": self.namespace_object,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// What the API server decided
// ---------------------------------------------------------------------------------------------

/// What the policy decided on one request, in one version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A matchCondition is false: the policy does not apply.
    NotMatched,
    /// Every validation is true.
    Admit,
    /// The validations that are false, in order, each with the message the API server returns.
    Deny(Vec<Denial>),
    /// An evaluation error (a matchCondition, a validation or a variable it uses, the cost
    /// budget), a denial under `failurePolicy: Fail`: every decision line.
    Error(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub validation: usize,
    pub message: String,
}

impl Decision {
    /// The messages of a denial.
    pub fn messages(&self) -> Vec<&str> {
        match self {
            Decision::Deny(d) => d.iter().map(|d| d.message.as_str()).collect(),
            _ => Vec::new(),
        }
    }
}

/// One case in one version.
#[derive(Clone, Debug)]
pub struct CaseRun {
    pub version: &'static str,
    pub decision: Decision,
    /// `messageExpression[i] result dropped: …` lines.
    pub dropped: Vec<String>,
    /// The actual cost of each expression (`matchCondition[0]`, `validation[1]`,
    /// `messageExpression[1]`, `variables total`).
    pub costs: Vec<(String, u64)>,
    /// The case's block of the output.
    pub raw: String,
}

/// One case, in every version.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub name: String,
    /// In the order of [`VERSIONS`].
    pub runs: Vec<CaseRun>,
}

impl Outcome {
    /// The decision of every version, when they all decided the same (up to the order of the
    /// findings in a message: [`same_up_to_order`]) and no message was dropped; else what
    /// differs, and the dropped messages.
    pub fn agreed(&self) -> Result<&Decision, String> {
        let first = &self.runs[0];
        let mut problems = Vec::new();
        for run in &self.runs[1..] {
            if !same_up_to_order(&run.decision, &first.decision) {
                problems.push(format!(
                    "the versions disagree: {} decided {:?}, {} decided {:?}",
                    first.version, first.decision, run.version, run.decision
                ));
            }
        }
        for run in &self.runs {
            for d in &run.dropped {
                problems.push(format!(
                    "{}: a message is over 5 KiB: {d} (the decision: {:?})",
                    run.version, run.decision
                ));
            }
        }
        if problems.is_empty() {
            Ok(&first.decision)
        } else {
            Err(problems.join("\n"))
        }
    }

    /// The highest cost of one expression, in any version.
    pub fn max_cost(&self) -> u64 {
        self.runs
            .iter()
            .flat_map(|r| r.costs.iter())
            .filter(|(what, _)| what != "variables total")
            .map(|(_, c)| *c)
            .max()
            .unwrap_or(0)
    }
}

/// Whether two decisions are the same, but for the order of the parts of a message (between
/// `; ` and `. `): the API server iterates a map of the object (`spec.pytorchReplicaSpecs`) in
/// Go's random order, so that findings joined from one come in any order, from one request to
/// the next as from one version to the next.
pub fn same_up_to_order(a: &Decision, b: &Decision) -> bool {
    let parts = |m: &str| {
        let mut p: Vec<String> = m
            .split("; ")
            .flat_map(|s| s.split(". "))
            .map(String::from)
            .collect();
        p.sort();
        p
    };
    match (a, b) {
        (Decision::Deny(x), Decision::Deny(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(x, y)| {
                    x.validation == y.validation && parts(&x.message) == parts(&y.message)
                })
        }
        _ => a == b,
    }
}

/// How one version compiled the policy.
#[derive(Clone, Debug)]
pub struct Compile {
    pub version: &'static str,
    /// As at creation (`NewExpressions`) and as stored (`StoredExpressions`).
    pub create_time: Duration,
    pub runtime: Duration,
}

/// The result of [`evaluate`]: the compiles, and the cases in the order given.
#[derive(Clone, Debug)]
pub struct Evaluation {
    pub compiles: Vec<Compile>,
    pub outcomes: Vec<Outcome>,
}

// ---------------------------------------------------------------------------------------------
// Running
// ---------------------------------------------------------------------------------------------

/// The permits of [`MAX_PROCESSES`].
static RUNNING: Mutex<usize> = Mutex::new(0);
static FREED: Condvar = Condvar::new();

struct Permit;

impl Permit {
    fn take() -> Permit {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= MAX_PROCESSES {
            running = FREED.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        Permit
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        FREED.notify_one();
    }
}

/// Compiles `vap` (the ValidatingAdmissionPolicy object) in every version of [`VERSIONS`] and
/// evaluates every case with it, one process per version. Panics on a compile error, on output
/// it cannot read, or when the binaries are missing (call [`tools_dir`] first to skip instead).
pub fn evaluate(vap: &Value, cases: &[Case]) -> Evaluation {
    evaluate_in(&VERSIONS, vap, cases)
}

/// [`evaluate`] in the given versions only (each of [`VERSIONS`]).
pub fn evaluate_in(versions: &[Version], vap: &Value, cases: &[Case]) -> Evaluation {
    let dir = tools_dir().unwrap_or_else(|| {
        panic!("kube-apiserver's CEL evaluator is missing ({DIR_ENV}, or .inputs/kube-cel: scripts/inputs.sh)")
    });
    let Inputs {
        dir: _work,
        policy: vap_path,
        cases: files,
    } = write_inputs("vap.json", vap, cases);
    let outputs: Vec<(Version, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = versions
            .iter()
            .map(|version| {
                let (dir, vap_path, files) = (&dir, &vap_path, &files);
                scope.spawn(move || (*version, run(dir, *version, vap_path, files)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut compiles = Vec::new();
    let mut per_version = Vec::new();
    for (version, output) in &outputs {
        let (compile, runs) = parse(*version, output, &files);
        compiles.push(compile);
        per_version.push(runs);
    }
    let mut outcomes: Vec<Outcome> = cases
        .iter()
        .map(|c| Outcome {
            name: c.name.clone(),
            runs: Vec::new(),
        })
        .collect();
    for runs in per_version {
        for (outcome, run) in outcomes.iter_mut().zip(runs) {
            outcome.runs.push(run);
        }
    }
    Evaluation { compiles, outcomes }
}

/// One version's process on every case; its standard output.
fn run(dir: &Path, version: Version, vap: &Path, cases: &[PathBuf]) -> String {
    let binary = dir.join(version.binary);
    let mut cmd = Command::new(&binary);
    cmd.env_clear().arg(vap).args(cases);
    if version.strict {
        cmd.env("STRICT", "1");
    }
    let out = {
        let _permit = Permit::take();
        cmd.output()
            .unwrap_or_else(|e| panic!("{}: cannot run: {e}", binary.display()))
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        panic!(
            "{} exited with {}:\n{}\n{}",
            binary.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            stdout
        );
    }
    stdout
}

/// A Go duration as the binaries print it (`3.067899957s`, `63.57989ms`, `861.924µs`, `1m2.5s`).
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..number_end].parse().ok()?;
        rest = &rest[number_end..];
        let (scale, unit_len) = [
            ("ns", 1e-9),
            ("µs", 1e-6),
            ("μs", 1e-6),
            ("us", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ]
        .iter()
        .find(|(unit, _)| rest.starts_with(unit))
        .map(|(unit, scale)| (*scale, unit.len()))?;
        total += number * scale;
        rest = &rest[unit_len..];
    }
    Some(Duration::from_secs_f64(total))
}

/// Reads one version's output: its compiles (failing on any error) and a run per case file,
/// in the order of `files`.
fn parse(version: Version, output: &str, files: &[PathBuf]) -> (Compile, Vec<CaseRun>) {
    let fail = |what: &str| -> ! {
        panic!(
            "{} ({}): {what}\n--- output ---\n{output}",
            version.label, version.binary
        )
    };
    let mut compile_times: Vec<Duration> = Vec::new();
    let mut compile_errors: Vec<String> = Vec::new();
    let mut blocks: Vec<(String, Vec<&str>)> = Vec::new();
    let mut in_compile = false;
    let mut header_seen = false;
    for line in output.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("== ") {
            if !rest.starts_with(version.label) {
                fail(&format!("not the output of {}: {line}", version.label));
            }
            header_seen = true;
            continue;
        }
        if let Some(rest) = line
            .strip_prefix("-- create-time compile (NewExpressions) took ")
            .or_else(|| line.strip_prefix("-- runtime compile (StoredExpressions) took "))
        {
            let (time, errors) = rest
                .split_once(": ")
                .unwrap_or_else(|| fail(&format!("a compile line: {line}")));
            compile_times.push(
                parse_go_duration(time).unwrap_or_else(|| fail(&format!("a compile time: {line}"))),
            );
            let count: usize = errors
                .strip_suffix(" errors")
                .or_else(|| errors.strip_suffix(" error"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| fail(&format!("a compile error count: {line}")));
            if count > 0 {
                compile_errors.push(format!("{}: {line}", version.label));
            }
            in_compile = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("-- case ") {
            let file = rest
                .strip_suffix(')')
                .and_then(|r| r.rsplit_once(" ("))
                .map(|(_, file)| file.to_string())
                .unwrap_or_else(|| fail(&format!("a case line: {line}")));
            blocks.push((file, vec![line]));
            in_compile = false;
            continue;
        }
        match blocks.last_mut() {
            Some((_, block)) if !in_compile => block.push(line),
            _ => {
                // Under a compile: its per-expression times and its errors.
                if line.trim_start().starts_with("ERROR") {
                    compile_errors.push(format!("{}: {}", version.label, line.trim()));
                } else if !line.trim_start().starts_with("compile ") {
                    fail(&format!("an unknown line: {line}"));
                }
            }
        }
    }
    if !header_seen || compile_times.len() != 2 {
        fail("no version header or not two compiles");
    }
    if !compile_errors.is_empty() {
        panic!(
            "the policy does not compile in kube-apiserver {}:\n{}",
            version.label,
            compile_errors.join("\n")
        );
    }
    if blocks.len() != files.len() {
        fail(&format!(
            "{} cases evaluated, {} given",
            blocks.len(),
            files.len()
        ));
    }
    let runs = blocks
        .into_iter()
        .zip(files)
        .map(|((file, block), path)| {
            // The file as given: compared by its name.
            let expected = path.file_name().unwrap().to_string_lossy();
            let found = Path::new(&file).file_name().map(|f| f.to_string_lossy());
            if found.as_deref() != Some(&*expected) {
                fail(&format!("the case {expected} is missing (found {file})"));
            }
            parse_case(version, &block).unwrap_or_else(|e| fail(&e))
        })
        .collect();
    let compile = Compile {
        version: version.label,
        create_time: compile_times[0],
        runtime: compile_times[1],
    };
    (compile, runs)
}

/// One case's block: its detail lines and its decision.
fn parse_case(version: Version, block: &[&str]) -> Result<CaseRun, String> {
    let raw = block.join("\n");
    let mut dropped = Vec::new();
    let mut costs = Vec::new();
    let mut decision_lines: Vec<String> = Vec::new();
    let mut in_decision = false;
    for line in &block[1..] {
        let text = line.trim();
        if let Some(first) = text.strip_prefix("decision: ") {
            if in_decision {
                return Err(format!("two decisions:\n{raw}"));
            }
            in_decision = true;
            decision_lines.push(first.to_string());
        } else if in_decision {
            if text.starts_with("validation ") {
                decision_lines.push(text.to_string());
            } else {
                // A message of several lines (a static message may have them).
                let last = decision_lines.last_mut().unwrap();
                last.push('\n');
                last.push_str(line);
            }
        } else if text.contains(" result dropped: ") {
            dropped.push(text.to_string());
        } else if let Some((what, rest)) = text.split_once(" cost=") {
            let number: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let cost = number
                .parse()
                .map_err(|_| format!("a cost: {text}\n{raw}"))?;
            costs.push((what.to_string(), cost));
        }
    }
    if decision_lines.is_empty() {
        return Err(format!("no decision:\n{raw}"));
    }
    let unreadable = || format!("an unknown decision:\n{raw}");
    let decision = if decision_lines.len() == 1 && decision_lines[0] == "ADMIT" {
        Decision::Admit
    } else if decision_lines.len() == 1
        && decision_lines[0].starts_with("NOT MATCHED (matchCondition ")
        && decision_lines[0].ends_with(" false) -> ADMIT")
    {
        Decision::NotMatched
    } else if decision_lines
        .iter()
        .any(|l| l.starts_with("DENY (failurePolicy Fail") || l.contains(" ERROR -> DENY (Fail)"))
    {
        Decision::Error(decision_lines.join("\n"))
    } else {
        let mut denials = Vec::new();
        for l in &decision_lines {
            let (index, message) = l
                .strip_prefix("validation ")
                .and_then(|r| r.split_once(" DENY: "))
                .ok_or_else(unreadable)?;
            denials.push(Denial {
                validation: index.parse().map_err(|_| unreadable())?,
                message: message.to_string(),
            });
        }
        Decision::Deny(denials)
    };
    Ok(CaseRun {
        version: version.label,
        decision,
        dropped,
        costs,
        raw,
    })
}

/// A ValidatingAdmissionPolicy that holds `conditions` (a webhook's `matchConditions`: the API
/// server compiles them in the environment of a policy's) and one validation `true`: `Admit`
/// when every condition is true (the webhook is called), `NotMatched` when one is false.
pub fn match_conditions_policy(conditions: &Value) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "match-conditions"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConditions": conditions,
            "validations": [{"expression": "true"}],
        },
    })
}

// ---------------------------------------------------------------------------------------------
// The MutatingAdmissionPolicy of kube-apiserver 1.36 (`map136`)
// ---------------------------------------------------------------------------------------------

/// The binary that applies a MutatingAdmissionPolicy as kube-apiserver 1.36 does.
pub const MAP_BINARY: &str = "map136";

/// The directory of `map136` ([`tools_dir`]'s), or `None` (the test is skipped) when it is
/// missing, a failure under `MODELGATE_REQUIRE_TOOLS=1`.
pub fn map_tools_dir() -> Option<PathBuf> {
    let dir = tools_dir()?;
    if dir.join(MAP_BINARY).is_file() {
        Some(dir)
    } else {
        required::missing(&format!(
            "kube-apiserver's MutatingAdmissionPolicy plugin ({MAP_BINARY} in {})",
            dir.display()
        ));
        None
    }
}

/// What the MAP did to one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapResult {
    Patched,
    Unchanged,
    /// The request is rejected with this message.
    Error(String),
}

/// One case after the MAP.
#[derive(Clone, Debug)]
pub struct MapRun {
    pub name: String,
    pub result: MapResult,
    /// The object after the policy (and its reinvocation), as kube-apiserver serializes the
    /// typed object; the case's object on an error.
    pub object: Value,
    /// The actual cost of each mutation run (`mutation[0]`, `(reinvoked) mutation[0]`) and of
    /// the matchConditions.
    pub costs: Vec<(String, u64)>,
    /// `ignored (failurePolicy Ignore): …` lines: errors a `failurePolicy: Ignore` skipped.
    pub ignored: Vec<String>,
    /// The case's block of the output.
    pub raw: String,
}

/// The result of [`apply_map`]: the compile times, and the cases in the order given.
#[derive(Clone, Debug)]
pub struct MapEvaluation {
    pub create_time: Duration,
    pub runtime: Duration,
    pub runs: Vec<MapRun>,
}

/// Compiles `map` (the MutatingAdmissionPolicy object) with `map136` and applies it to every
/// case, all in one process. Panics on a compile error, on output it cannot read, or when the
/// binary is missing (call [`map_tools_dir`] first to skip instead).
pub fn apply_map(map: &Value, cases: &[Case]) -> MapEvaluation {
    let dir = map_tools_dir().unwrap_or_else(|| {
        panic!("{MAP_BINARY} is missing ({DIR_ENV}, or .inputs/kube-cel: scripts/inputs.sh)")
    });
    let Inputs {
        dir: _work,
        policy: map_path,
        cases: files,
    } = write_inputs("map.json", map, cases);
    let binary = dir.join(MAP_BINARY);
    let out = {
        let _permit = Permit::take();
        Command::new(&binary)
            .env_clear()
            .arg(&map_path)
            .args(&files)
            .output()
            .unwrap_or_else(|e| panic!("{}: cannot run: {e}", binary.display()))
    };
    let output = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        panic!(
            "{} exited with {}:\n{}\n{output}",
            binary.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_map(&output, cases)
}

fn parse_map(output: &str, cases: &[Case]) -> MapEvaluation {
    let fail =
        |what: &str| -> ! { panic!("{MAP_BINARY}: {what}\n--- output ---\n{output:.20000}") };
    let mut times = Vec::new();
    let mut errors = Vec::new();
    let mut blocks: Vec<Vec<&str>> = Vec::new();
    for line in output.lines() {
        if line.trim().is_empty() || line.starts_with("== ") {
            continue;
        }
        if let Some(rest) = line
            .strip_prefix("-- create-time compile (NewExpressions) took ")
            .or_else(|| line.strip_prefix("-- runtime compile (StoredExpressions) took "))
        {
            let (time, count) = rest
                .split_once(": ")
                .unwrap_or_else(|| fail(&format!("a compile line: {line}")));
            times.push(parse_go_duration(time).unwrap_or_else(|| fail(line)));
            if !count.starts_with("0 error") {
                errors.push(line.to_string());
            }
            continue;
        }
        if line.starts_with("-- case ") {
            blocks.push(vec![line]);
            continue;
        }
        match blocks.last_mut() {
            Some(block) => block.push(line),
            None if line.trim_start().starts_with("ERROR") => errors.push(line.to_string()),
            None => {}
        }
    }
    if !errors.is_empty() {
        panic!(
            "the MAP does not compile in kube-apiserver 1.36:\n{}",
            errors.join("\n")
        );
    }
    if times.len() != 2 || blocks.len() != cases.len() {
        fail(&format!(
            "{} compiles, {} cases evaluated, {} given",
            times.len(),
            blocks.len(),
            cases.len()
        ));
    }
    let runs = blocks
        .into_iter()
        .zip(cases)
        .map(|(block, case)| {
            let mut result = None;
            let mut object = None;
            let mut costs = Vec::new();
            let mut ignored = Vec::new();
            for line in &block[1..] {
                let text = line.trim();
                if let Some(r) = text.strip_prefix("result: ") {
                    result = Some(match r {
                        "PATCHED" => MapResult::Patched,
                        "UNCHANGED" => MapResult::Unchanged,
                        other => MapResult::Error(
                            other.strip_prefix("ERROR ").unwrap_or(other).to_string(),
                        ),
                    });
                } else if let Some(o) = text.strip_prefix("object: ") {
                    object =
                        Some(serde_json::from_str(o).unwrap_or_else(|e| {
                            fail(&format!("the object of {}: {e}", case.name))
                        }));
                } else if text.starts_with("ignored") {
                    ignored.push(text.to_string());
                } else if let Some((what, rest)) = text.split_once(" cost=") {
                    let cost = rest.split(' ').next().and_then(|c| c.parse().ok());
                    if let Some(cost) = cost {
                        costs.push((what.to_string(), cost));
                    }
                }
            }
            MapRun {
                name: case.name.clone(),
                result: result.unwrap_or_else(|| fail(&format!("no result for {}", case.name))),
                object: object.unwrap_or_else(|| fail(&format!("no object for {}", case.name))),
                costs,
                ignored,
                raw: block.join("\n"),
            }
        })
        .collect();
    MapEvaluation {
        create_time: times[0],
        runtime: times[1],
        runs,
    }
}
