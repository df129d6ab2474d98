//! `modelgate review`: the admission pipeline run offline on manifests or AdmissionReviews.
//!
//! `--webhook both` (the default) does what the API server does: mutate, apply the patch, then
//! validate the result.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};

use super::{CacheFiles, EXIT_USAGE};
use crate::admission::{self, Context, Decision, Request, Webhook};
use crate::cache::{CacheIndex, ClusterCacheError, list};
use crate::cli::policy::PolicyArgs;
use crate::config::AbsentClaims;
use crate::documents::{Document, read_documents};
use crate::junit;
use crate::namespaces::{self, NamespaceDocuments, Namespaces};
use crate::policy::Caches;
use crate::policy::model_cache::{MODEL_CACHE, RESOLVED_URI};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WebhookChoice {
    Mutate,
    Validate,
    Both,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One human line per object.
    Summary,
    /// One AdmissionReview response (JSON) per line.
    Review,
    /// One JSON Patch array per line (`[]` when nothing changes).
    Patch,
    /// The resulting objects as YAML documents.
    Patched,
    /// One resulting object (JSON) per line.
    PatchedJson,
    /// A unified diff of each object before and after the patch, as YAML (nothing for an
    /// object that does not change).
    Diff,
    /// A JUnit XML report: one test case per object, a failure per denial.
    Junit,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Exit codes:\n  0  every object was allowed\n  1  at least one object was denied \
(each denial is also printed on stderr, whatever -o is)\n  2  bad input or flags (nothing is reviewed)"
)]
pub struct ReviewArgs {
    /// Files to review (YAML or JSON, several documents or a List); `-` or nothing reads stdin.
    #[arg(value_name = "FILE|-")]
    pub inputs: Vec<PathBuf>,

    #[command(flatten)]
    pub caches: CacheFiles,

    /// Also list the cluster's cache objects, PVCs, Nodes and Namespaces (their modelgate.io/mode
    /// and Pod Security labels) once, with the current kubeconfig context; list calls only.
    /// --caches objects and Namespaces replace the cluster's of the same kind, namespace and name.
    #[arg(long)]
    pub from_cluster: bool,

    /// Namespace for objects that name none.
    #[arg(
        long,
        short = 'n',
        default_value = "default",
        env = "MODELGATE_NAMESPACE"
    )]
    pub namespace: String,

    /// Which webhook to run; `both` mutates, applies the patch, then validates.
    #[arg(long, value_enum, default_value_t = WebhookChoice::Both)]
    pub webhook: WebhookChoice,

    #[arg(long, short = 'o', value_enum, default_value_t = Output::Summary)]
    pub output: Output,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

pub fn run(args: ReviewArgs) -> ExitCode {
    match execute(args, &mut std::io::stdout().lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// The result of reviewing one document.
pub struct Reviewed {
    pub origin: String,
    pub request: Request,
    pub decision: Decision,
    /// The object after the mutating patch (the object as given when nothing changed).
    pub patched: Option<Value>,
}

/// Reads every input, reviews every document, writes the chosen output. `Ok(true)` when all
/// were allowed.
pub fn execute(args: ReviewArgs, out: &mut dyn Write) -> anyhow::Result<bool> {
    let mut config = args.policy.clone().into_config();
    // Claims listed from the cluster are all there are; those of files may be a few.
    if args.from_cluster {
        config.absent_claims = AbsentClaims::Missing;
    }
    let super::LoadedFiles {
        mut index,
        namespaces: file_namespaces,
        skipped,
    } = args.caches.load()?;
    super::note_skipped(&skipped);
    let mut namespaces = file_namespaces.over(Namespaces::default());
    if args.from_cluster {
        let cluster = list_cluster(&index, &file_namespaces)?;
        for note in &cluster.caches.notes {
            eprintln!("note: --from-cluster: {note}");
        }
        index = cluster.caches.index;
        namespaces = cluster.namespaces;
    }
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: &namespaces,
        now: Some(crate::unix_now()),
    };
    let mut docs = Vec::new();
    let inputs = if args.inputs.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.inputs.clone()
    };
    for path in &inputs {
        let (origin, text) = super::read_input(path)?;
        docs.extend(read_documents(&origin, &text)?);
    }
    // Every document is checked before any output, so bad input never yields partial results.
    let mut requests = Vec::new();
    for doc in docs {
        let request = to_request(&doc, &args.namespace).with_context(|| doc.origin.clone())?;
        requests.push((doc, request));
    }
    let mut all_allowed = true;
    let mut reader_gone = false;
    let mut junit_cases = Vec::new();
    for (doc, review_value) in requests {
        let mut r = review_one(doc.origin.clone(), review_value, args.webhook, &ctx)?;
        // The AdmissionReview answer stays the webhook's; the human outputs name the lines.
        if args.output != Output::Review {
            point_at_lines(&mut r.decision, &doc);
        }
        all_allowed &= r.decision.allowed;
        if !r.decision.allowed {
            // On stderr in every output mode: `-o patch` prints `[]` and `-o patched` the
            // unchanged object for a denied one, which alone would read as "nothing to do".
            eprintln!("{}: {}: denied: {}", r.origin, who(&r), denial_message(&r));
        }
        if args.output == Output::Junit {
            junit_cases.push(junit_case(&r));
            continue;
        }
        if reader_gone {
            continue;
        }
        if let Err(e) = write_output(out, args.output, &r) {
            // `review … | head`: the reader left; the exit code still reports the decisions.
            match e.downcast_ref::<std::io::Error>() {
                Some(io) if io.kind() == std::io::ErrorKind::BrokenPipe => reader_gone = true,
                _ => return Err(e),
            }
        }
    }
    if args.output == Output::Junit {
        let suite = junit::Suite {
            name: "modelgate review".into(),
            cases: junit_cases,
        };
        junit::write(out, "modelgate review", &[suite])?;
    }
    Ok(all_allowed)
}

/// What `--from-cluster` reads, with the files laid over it.
struct Cluster {
    caches: list::Listed,
    namespaces: Namespaces,
}

/// Lists the cluster's routing objects and Namespaces once, with the current kubeconfig context
/// (or the in-cluster configuration); the files' objects replace the cluster's of the same
/// kind, namespace and name. A Namespace list that fails is an error like any other: a
/// namespace's mode decides the verdict, so guessing `--default-mode` would give another one.
fn list_cluster(
    files: &CacheIndex,
    file_namespaces: &NamespaceDocuments,
) -> anyhow::Result<Cluster> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClusterCacheError::Runtime)?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(ClusterCacheError::Client)?;
        let caches = list::list_once(client.clone(), files).await?;
        let namespaces = namespaces::list::list_once(&client, 500)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot list namespaces: {}; review --from-cluster reads each namespace's \
                     modelgate.io/mode and Pod Security labels (RBAC: list on namespaces)",
                    crate::audit::cluster::reason(&e)
                )
            })?;
        Ok(Cluster {
            caches,
            namespaces: file_namespaces.over(namespaces),
        })
    })
}

/// Puts, in a denial's message, the file and line before each field it names (the policy only
/// knows paths inside the object): `pod.yaml:14: spec.containers[0].securityContext.runAsUser: …`.
fn point_at_lines(decision: &mut Decision, doc: &Document) {
    let Some(message) = decision.message.as_mut() else {
        return;
    };
    let within = match doc.value.get("kind").and_then(Value::as_str) {
        Some("AdmissionReview") => "request.object.",
        _ if doc.value.get("uid").is_some() && doc.value.get("operation").is_some() => "object.",
        _ => "",
    };
    for field in decision.violations.iter().map(|v| &v.field) {
        let needle = format!("{field}: ");
        // A whole field, not the end of a longer one (`spec.template.spec.…`).
        let Some(at) = message
            .match_indices(&needle)
            .map(|(at, _)| at)
            .find(|&at| at == 0 || message[..at].ends_with(' '))
        else {
            continue;
        };
        let path = format!("{within}{field}");
        if let Some(place) = doc.locate(path.trim_end_matches('.')) {
            message.insert_str(at, &format!("{place}: "));
        }
    }
}

fn junit_case(r: &Reviewed) -> junit::Case {
    let s = r.request.summary(&r.decision);
    let mut output = Vec::new();
    if r.decision.patch_len() > 0 {
        output.push(format!("{} patch operations", r.decision.patch_len()));
    }
    output.extend(r.decision.warnings.iter().map(|w| format!("warning: {w}")));
    junit::Case {
        classname: r.origin.clone(),
        name: format!("{} {}/{}", s.kind, s.namespace, s.name),
        failure: (!r.decision.allowed).then(|| r.decision.message.clone().unwrap_or_default()),
        output: (!output.is_empty()).then(|| output.join("\n")),
    }
}

/// Turns a document into an AdmissionReview: used as is when it is one, wrapped when it is a
/// bare AdmissionRequest (Kubewarden's test format), else wrapped as the dry-run CREATE the API
/// server would send. Each is then decoded as `serve` decodes a body ([`Request::from_slice`]).
fn to_request(doc: &Document, default_ns: &str) -> anyhow::Result<Value> {
    let v = &doc.value;
    let kind = v.get("kind");
    if kind.and_then(Value::as_str) == Some("AdmissionReview") {
        let mut review = v.clone();
        complete_request(&mut review, &doc.origin);
        return Ok(review);
    }
    if kind.is_some_and(Value::is_object) && v.get("uid").is_some() && v.get("operation").is_some()
    {
        return Ok(
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": v}),
        );
    }
    if v.get("apiVersion").and_then(Value::as_str).is_none()
        || kind.and_then(Value::as_str).is_none()
    {
        bail!("not a Kubernetes object: apiVersion and kind are required");
    }
    Ok(admission::create_review(v, default_ns, "modelgate-review"))
}

/// Hand-written AdmissionReviews (gatekeeper's samples) often carry only the operation and the
/// object. Offline, the fields the API server always sets are derived from the object, so the
/// review still runs; a field that is present is never changed.
fn complete_request(review: &mut Value, origin: &str) {
    let Some(req) = review.get_mut("request").and_then(Value::as_object_mut) else {
        return;
    };
    let object = req.get("object").cloned().unwrap_or(Value::Null);
    let api_version = object
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or("v1");
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let kind = object.get("kind").and_then(Value::as_str).unwrap_or("");
    let defaults = [
        ("uid", json!(format!("modelgate-review-{origin}"))),
        (
            "kind",
            json!({"group": group, "version": version, "kind": kind}),
        ),
        (
            "resource",
            json!({"group": group, "version": version, "resource": format!("{}s", kind.to_lowercase())}),
        ),
        ("userInfo", json!({"username": "modelgate-review"})),
    ];
    for (key, value) in defaults {
        req.entry(key).or_insert(value);
    }
    if let Some(ns) = object.pointer("/metadata/namespace").cloned() {
        req.entry("namespace").or_insert(ns);
    }
}

fn review_one(
    origin: String,
    review: Value,
    webhook: WebhookChoice,
    ctx: &Context,
) -> anyhow::Result<Reviewed> {
    let body = serde_json::to_vec(&review)?;
    let mut request = match Request::from_slice(&body) {
        Ok(r) => r,
        Err(admission::DecodeError::Unanswerable(m)) => bail!("{origin}: {m}"),
        Err(admission::DecodeError::Invalid { message, .. }) => bail!("{origin}: {message}"),
    };
    let mut decision = match webhook {
        WebhookChoice::Validate => admission::decide(Webhook::Validate, &request, ctx),
        WebhookChoice::Mutate | WebhookChoice::Both => {
            admission::decide(Webhook::Mutate, &request, ctx)
        }
    };
    let mut patched: Option<Value> = match request.object.as_deref() {
        Some(raw) => Some(serde_json::from_str(raw.get())?),
        None => None,
    };
    if let (Some(obj), Some(patch)) = (patched.as_mut(), decision.patch.as_ref()) {
        let ops = patch
            .try_operations()
            .with_context(|| format!("{origin}: the patch is not a JSON Patch"))?;
        json_patch::patch(obj, &ops)
            .with_context(|| format!("{origin}: the patch does not apply"))?;
    }
    if webhook == WebhookChoice::Both && decision.allowed {
        // Validate what the API server would store: the patched object (when there is a patch).
        let patched_raw = match decision.patch {
            Some(_) => patched
                .as_ref()
                .map(serde_json::value::to_raw_value)
                .transpose()?,
            None => request.object.clone(),
        };
        let original = std::mem::replace(&mut request.object, patched_raw);
        let validation = admission::decide(Webhook::Validate, &request, ctx);
        request.object = original;
        merge_validation(&mut decision, validation);
    }
    Ok(Reviewed {
        origin,
        request,
        decision,
        patched,
    })
}

/// What the API server does with two webhooks: allowed only if both allow; both warn (a text
/// already given is shown once); both annotate the audit log.
fn merge_validation(decision: &mut Decision, validation: Decision) {
    for w in validation.warnings {
        if !decision.warnings.contains(&w) {
            decision.warnings.push(w);
        }
    }
    for (k, v) in validation.audit_annotations {
        decision.audit_annotations.entry(k).or_insert(v);
    }
    if !validation.allowed {
        decision.allowed = false;
        decision.message = validation.message;
        decision.code = validation.code;
        // What the denial names, so that its fields get their file and line.
        decision.violations = validation.violations;
    }
}

/// The unified diff of an object before and after its patch, as YAML; empty when they are equal.
pub fn unified_diff(origin: &str, before: &Value, after: &Value) -> anyhow::Result<String> {
    if before == after {
        return Ok(String::new());
    }
    let before = serde_saphyr::to_string(before)?;
    let after = serde_saphyr::to_string(after)?;
    let diff = similar::TextDiff::from_lines(&before, &after);
    Ok(diff
        .unified_diff()
        .context_radius(3)
        .header(origin, &format!("{origin} (patched)"))
        .to_string())
}

fn write_output(out: &mut dyn Write, mode: Output, r: &Reviewed) -> anyhow::Result<()> {
    match mode {
        Output::Summary => {
            let operations = r.decision.patch_len();
            let mut line = if r.decision.allowed {
                format!(
                    "{}: {}: allowed, {operations} patch operation{}",
                    r.origin,
                    who(r),
                    if operations == 1 { "" } else { "s" }
                )
            } else {
                format!("{}: {}: denied: {}", r.origin, who(r), denial_message(r))
            };
            let cache = r
                .patched
                .as_ref()
                .filter(|_| r.decision.allowed)
                .and_then(model_cache_outcome);
            if let Some(cache) = &cache {
                line.push_str(&format!("; {cache}"));
            }
            // The API response carries a hit as a warning (`model … served from …`); here it is
            // reported as the hit above, and the warnings are the ones that need attention.
            let hit = cache
                .as_ref()
                .is_some_and(|c| c.starts_with("model cache hit"));
            let warnings: Vec<&str> = r
                .decision
                .warnings
                .iter()
                .map(String::as_str)
                .filter(|w| !(hit && w.starts_with("model ") && w.contains(" served from ")))
                .collect();
            if !warnings.is_empty() {
                line.push_str(&format!("; warnings: {}", warnings.join(" | ")));
            }
            if !r.decision.audit_annotations.is_empty() {
                let notes: Vec<String> = r
                    .decision
                    .audit_annotations
                    .iter()
                    .map(|(k, v)| format!("{k}: {v}"))
                    .collect();
                line.push_str(&format!("; audit annotations: {}", notes.join(" | ")));
            }
            writeln!(out, "{line}")?;
        }
        Output::Review => {
            let outcome = admission::respond(&r.request, &r.decision);
            out.write_all(&outcome.body)?;
            writeln!(out)?;
        }
        Output::Patch => {
            let ops = r
                .decision
                .patch
                .as_ref()
                .map_or(&b"[]"[..], |p| p.as_bytes());
            out.write_all(ops)?;
            writeln!(out)?;
        }
        Output::Patched => {
            let obj = r.patched.clone().unwrap_or(Value::Null);
            writeln!(out, "---\n{}", serde_saphyr::to_string(&obj)?.trim_end())?;
        }
        Output::PatchedJson => {
            let obj = r.patched.clone().unwrap_or(Value::Null);
            writeln!(out, "{}", serde_json::to_string(&obj)?)?;
        }
        Output::Diff => {
            if !r.decision.allowed {
                eprintln!(
                    "{}: denied: {}",
                    r.origin,
                    r.decision.message.as_deref().unwrap_or("")
                );
                return Ok(());
            }
            let before: Value = match r.request.object.as_deref() {
                Some(raw) => serde_json::from_str(raw.get())?,
                None => Value::Null,
            };
            let after = r.patched.as_ref().unwrap_or(&before);
            write!(out, "{}", unified_diff(&r.origin, &before, after)?)?;
        }
        // Written once, after every object.
        Output::Junit => {}
    }
    Ok(())
}

/// `Pod team-a/llm`: the kind, namespace and name (or generateName) of a reviewed object.
fn who(r: &Reviewed) -> String {
    let s = r.request.summary(&r.decision);
    format!("{} {}/{}", s.kind, s.namespace, s.name)
}

fn denial_message(r: &Reviewed) -> &str {
    r.decision.message.as_deref().unwrap_or("(no message)")
}

/// The model cache outcome recorded in the patched object's annotations (the pod's, or a Job's
/// template's): `model cache hit: <cache> (<resolved URI>)` or `model cache miss: <reason>`;
/// `None` when the object has no model cache annotation.
fn model_cache_outcome(patched: &Value) -> Option<String> {
    let annotations = [
        "/metadata/annotations",
        "/spec/template/metadata/annotations",
    ]
    .iter()
    .filter_map(|p| patched.pointer(p))
    .find(|a| a.get(MODEL_CACHE).is_some())?;
    let text = |key: &str| annotations.get(key).and_then(Value::as_str).unwrap_or("");
    Some(match text(MODEL_CACHE) {
        "miss" => match text(MODEL_CACHE_REASON) {
            "" => "model cache miss".to_string(),
            reason => format!("model cache miss: {reason}"),
        },
        cache => format!("model cache hit: {cache} ({})", text(RESOLVED_URI)),
    })
}

const MODEL_CACHE_REASON: &str = "modelgate.io/model-cache-reason";
