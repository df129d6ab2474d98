//! The wire format: one AdmissionReview in, one AdmissionReview out (docs/policy.md §1 and §7).
//!
//! [`review`] is the single entry point that `serve` and `review` share. It decodes the
//! envelope, decides by kind and operation which part of the policy applies, and encodes the
//! answer: uid echoed, `apiVersion` answered in kind, a base64 `patch` only when there are
//! operations.

mod decode;
mod encode;
mod mode;
mod templates;

pub use templates::{TemplateAt, partial_findings, templates_of};

pub use crate::policy::MAX_WARNING_LEN;
pub use decode::{ApiVersion, DecodeError, Envelope, Request, create_review};

use decode::ObjectInput;
pub use mode::PolicyResult;

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use crate::cache::Resolved;
use crate::config::PolicyConfig;
use crate::exceptions;
use crate::kinds::WorkloadKind;
use crate::namespaces::{Mode, Namespaces};
use crate::patch::{FieldPath, apply};
use crate::policy::view::{self, JobView, ObjectMetaView, PodTemplateOf, PodView};
use crate::policy::{self, Caches, Denial, EphemeralScope, Mutation, Rule, Workload};

/// Which webhook endpoint is answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Webhook {
    Mutate,
    Validate,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Webhook::Mutate => "mutate",
            Webhook::Validate => "validate",
        }
    }
}

/// What the policy needs besides the request.
#[derive(Clone, Copy)]
pub struct Context<'a> {
    pub config: &'a PolicyConfig,
    pub caches: Caches<'a>,
    /// Namespace modes and Pod Security levels ([`Namespaces::none`] when none is known).
    pub namespaces: &'a Namespaces,
    /// The time of the decision, Unix seconds, for exceptions' `expires` (docs/exceptions.md);
    /// `None` honours no exception. The core has no clock: the caller's is given here.
    pub now: Option<i64>,
}

/// The decision for one request, before encoding.
#[derive(Debug, Default)]
pub struct Decision {
    pub allowed: bool,
    /// The denial message, when not allowed.
    pub message: Option<String>,
    /// HTTP-like status code inside the response (`status.code`) for a denial.
    pub code: Option<u16>,
    pub patch: Option<crate::patch::Patch>,
    pub warnings: Vec<String>,
    /// `auditAnnotations` (keys without the webhook-name prefix the API server adds).
    pub audit_annotations: BTreeMap<&'static str, String>,
    /// The namespace's mode, when the policy was consulted.
    pub mode: Option<Mode>,
    /// What the policy did, when it was consulted (for `modelgate_policy_results_total`).
    pub result: Option<PolicyResult>,
    /// How the pod's model URI was resolved, when the policy resolved one (any mode but `off`).
    pub model_cache: Option<Resolved>,
    /// What a patch changes, rule by rule (in `enforce`), for reports such as `audit`.
    pub changes: Vec<policy::Change>,
    /// What a denial names, in the order of its message, with each field's rule, so that
    /// offline tools can count by rule and point at the fields in the user's file.
    pub violations: Vec<policy::Violation>,
    /// The exceptions the decision used (docs/exceptions.md), for the metric and reports.
    pub exceptions: Vec<crate::exceptions::ExceptionUse>,
    /// What the answer warns of without denying (the rules that only warn, such as
    /// `root-equivalent`), with each field's rule, for reports such as `audit`.
    pub findings: policy::Findings,
    /// The object's namespace and name (or generateName), for logs, once it is decoded.
    pub object_namespace: Option<String>,
    pub object_name: Option<String>,
    /// The claim of the object's namespace that the decision took as missing because the
    /// cluster state does not have it (yet): `serve` reads it and decides again.
    pub claim_to_read: Option<String>,
}

impl Decision {
    fn allow() -> Self {
        Decision {
            allowed: true,
            ..Default::default()
        }
    }

    fn deny(denial: &Denial) -> Self {
        Decision {
            allowed: false,
            message: Some(denial.to_string()),
            code: Some(403),
            violations: denial.violations.clone(),
            ..Default::default()
        }
    }

    fn invalid(message: String) -> Self {
        Decision {
            allowed: false,
            message: Some(message),
            code: Some(400),
            ..Default::default()
        }
    }

    pub fn patch_len(&self) -> usize {
        self.patch.as_ref().map_or(0, |p| p.len())
    }
}

/// What a log line and the metrics need to know about one admission.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub uid: String,
    /// `Pod`, `Job`, another kind, or empty when the body could not be read.
    pub kind: String,
    pub namespace: String,
    /// The name, else the `generateName` prefix.
    pub name: String,
    pub operation: String,
    pub dry_run: bool,
    pub allowed: bool,
    pub patch_operations: usize,
    /// The namespace's mode and the policy's result, when the policy was consulted.
    pub mode: Option<Mode>,
    pub result: Option<PolicyResult>,
    /// How the pod's model URI was resolved (for `modelgate_cache_lookups_total`).
    pub model_cache: Option<Resolved>,
    /// Why the request could not be handled as an admission (for error metrics).
    pub error: Option<&'static str>,
    /// [`Decision::claim_to_read`], in [`Summary::namespace`].
    pub claim_to_read: Option<String>,
    /// The names of the exceptions the answer used, in [`Summary::namespace`].
    pub exceptions: Vec<String>,
}

/// The encoded answer: the HTTP status and body, plus the summary for logs and metrics.
#[derive(Debug)]
pub struct Outcome {
    pub http_status: u16,
    pub body: Vec<u8>,
    pub summary: Summary,
}

/// Handles one AdmissionReview body end to end. Never panics on input.
pub fn review(webhook: Webhook, body: &[u8], ctx: &Context) -> Outcome {
    let (request, object) = match Request::from_slice_with_object(body) {
        Ok(r) => r,
        Err(DecodeError::Unanswerable(message)) => {
            let error = if message.contains("not JSON") {
                "invalid_json"
            } else {
                "invalid_review"
            };
            return encode::bad_request(message, error);
        }
        Err(DecodeError::Invalid { envelope, message }) => {
            let summary = Summary {
                uid: envelope.uid.clone(),
                error: Some("invalid_review"),
                ..Default::default()
            };
            return encode::response(&envelope, &Decision::invalid(message), summary);
        }
    };
    let decision = decide_object(webhook, &request, object, body, ctx);
    respond(&request, &decision)
}

/// Encodes the decision for a decoded request.
pub fn respond(request: &Request, decision: &Decision) -> Outcome {
    encode::response(&request.envelope, decision, request.summary(decision))
}

/// The decision for a decoded request: dispatch by kind and operation (docs/policy.md §1).
pub fn decide(webhook: Webhook, req: &Request, ctx: &Context) -> Decision {
    let object = req
        .object
        .as_deref()
        .map_or(ObjectInput::Missing, ObjectInput::Raw);
    decide_object(webhook, req, object, &[], ctx)
}

/// [`decide`] with the object as the decode left it; `body` is the review it came from (empty
/// when the request was not decoded from a body), where its text is found again if needed.
fn decide_object(
    webhook: Webhook,
    req: &Request,
    object: ObjectInput,
    body: &[u8],
    ctx: &Context,
) -> Decision {
    let mut decision = decide_unbounded(webhook, req, object, body, ctx);
    bound_warnings(&mut decision.warnings);
    decision
}

/// docs/policy.md §7: an answer has at most [`MAX_LISTED`](policy::MAX_LISTED) warnings, each of at
/// most [`MAX_WARNING_LEN`] bytes (the API server truncates longer ones). When there were more,
/// the last one kept says how many were left out.
fn bound_warnings(warnings: &mut Vec<String>) {
    if warnings.len() > policy::MAX_LISTED {
        let left_out = warnings.len() - (policy::MAX_LISTED - 1);
        warnings.truncate(policy::MAX_LISTED - 1);
        warnings.push(format!("… and {left_out} more warnings"));
    }
    for w in warnings.iter_mut() {
        clip_warning(w);
    }
}

/// Cuts a warning the policy could not fit (it shortens URIs itself, so that names survive) at
/// [`MAX_WARNING_LEN`] bytes, on a character boundary, marked `…`.
fn clip_warning(w: &mut String) {
    if w.len() <= MAX_WARNING_LEN {
        return;
    }
    let mut end = MAX_WARNING_LEN - '…'.len_utf8();
    while !w.is_char_boundary(end) {
        end -= 1;
    }
    w.truncate(end);
    w.push('…');
}

/// [`decide_object`] before its warnings are bounded.
fn decide_unbounded(
    webhook: Webhook,
    req: &Request,
    object: ObjectInput,
    body: &[u8],
    ctx: &Context,
) -> Decision {
    if req.group == exceptions::GROUP && req.kind == exceptions::KIND {
        let object = match object {
            ObjectInput::Missing => None,
            ObjectInput::Raw(raw) => Some(raw),
            ObjectInput::Decoded(_) => decode::raw_object(body),
        };
        return decide_exception_object(webhook, req, object, ctx);
    }
    if let Some(entry) = ctx
        .config
        .workload_kinds
        .find(&req.group, &req.version, &req.kind)
    {
        let object = match object {
            ObjectInput::Missing => None,
            ObjectInput::Raw(raw) => Some(raw),
            ObjectInput::Decoded(_) => decode::raw_object(body),
        };
        return templates::decide(webhook, req, entry, object, ctx);
    }
    let Some(kind) = req.workload_kind().filter(|k| k.is_mutated()) else {
        let mut d = Decision::allow();
        if webhook == Webhook::Mutate {
            d.warnings.push(format!(
                "modelgate does not handle {}; allowed without changes",
                req.kind_display()
            ));
        }
        return d;
    };
    let ephemeral_update = kind == WorkloadKind::Pod
        && req.operation == "UPDATE"
        && req.sub_resource.as_deref() == Some("ephemeralcontainers");
    let create = req.operation == "CREATE" && req.sub_resource.is_none();
    // A Pod UPDATE of the main resource: the validator compares the prep container's image.
    let pod_update = kind == WorkloadKind::Pod
        && req.operation == "UPDATE"
        && req.sub_resource.is_none()
        && webhook == Webhook::Validate;
    if !(create || ephemeral_update || pod_update) || ctx.config.is_exempt(&req.namespace) {
        return Decision::allow();
    }
    let (decoded, raw) = match object {
        ObjectInput::Missing => {
            return Decision::invalid(format!(
                "request.object is missing on {} of a {}",
                req.operation,
                kind.as_str()
            ));
        }
        ObjectInput::Decoded(d) => ((*d).of_kind(kind), None),
        ObjectInput::Raw(raw) => (DecodedObject::decode(kind, raw.get()), Some(raw)),
    };
    let from = namespace_of(
        &req.namespace,
        decoded.as_ref().ok().and_then(|d| d.namespace()),
    );
    let (decoded, from_object) = match from {
        NamespaceOf::Mismatch(denial) => (Err(denial), false),
        NamespaceOf::Object => (decoded, true),
        NamespaceOf::Request => (decoded, false),
    };
    let namespace = match &decoded {
        Ok(d) if from_object => d.namespace().unwrap_or_default(),
        _ => req.namespace.as_str(),
    };
    if is_exempt(ctx, namespace, &decoded) {
        let mut d = Decision::allow();
        d.object_namespace = Some(namespace.to_string());
        d.object_name = decoded.ok().and_then(|d| d.name().map(str::to_string));
        return d;
    }
    let ns_mode = ctx.namespaces.mode(namespace, ctx.config.default_mode);
    let mut decision_claim = None;
    let mut decision = if ns_mode.mode == Mode::Off {
        mode::off()
    } else {
        let restricted = ctx
            .namespaces
            .enforces_restricted(namespace, ctx.config.pod_security_default);
        let claim_to_read = &mut decision_claim;
        // An ephemeral-container update judges only the ephemeral containers the stored pod
        // does not have; without an old object that reads as a Pod, the whole pod
        // (docs/policy.md, "Ephemeral containers (`kubectl debug`)").
        let stored = req
            .old_object
            .as_deref()
            .filter(|_| ephemeral_update)
            .and_then(|old| policy::StoredEphemeral::decode(old.get()));
        let ephemeral = ephemeral_update.then_some(match &stored {
            Some(stored) => EphemeralScope::NewOnly(stored),
            None => EphemeralScope::WholePod,
        });
        let mut root_equivalent = policy::Findings::default();
        let found = &mut root_equivalent;
        let in_scope = exceptions_in(ctx, namespace);
        let mut used_exceptions = Vec::new();
        let used = &mut used_exceptions;
        let verdict = decoded.as_ref().map_err(Clone::clone).and_then(|d| {
            let workload = d.workload(namespace, restricted, ctx.caches.index(), in_scope)?;
            if !in_scope.is_empty() && !pod_update {
                *used = uses(&workload);
            }
            if create {
                *claim_to_read = policy::claim_to_read(&workload, ctx.config).map(str::to_string);
            }
            // Warned of by `/validate` only (policy::root_equivalent says why).
            if webhook == Webhook::Validate && !pod_update {
                *found = policy::root_equivalent::check(&workload, ephemeral);
            }
            if pod_update {
                return policy::validate_pod_update(
                    &workload,
                    req.old_object.as_deref().map(RawValue::get),
                )
                .map(|()| Mutation::default());
            }
            match (webhook, ns_mode.mode) {
                // Nothing was patched in these modes, so the validator judges the object as
                // enforce's mutation would have left it: only the denials enforce would give.
                (Webhook::Validate, Mode::Warn | Mode::Audit) => {
                    let Some(object) = raw.or_else(|| decode::raw_object(body)) else {
                        // Decoded from this body, so its text is there; judging the object
                        // as it came is the honest fallback.
                        return judge(Webhook::Validate, ephemeral, &workload, ctx);
                    };
                    validate_as_enforced(kind, object, ephemeral, &workload, ctx)
                }
                _ => judge(webhook, ephemeral, &workload, ctx),
            }
        });
        let mut d = mode::answer(ns_mode, verdict);
        add_findings(&mut d, root_equivalent);
        note_exceptions(&mut d, used_exceptions);
        d
    };
    decision.object_namespace = Some(namespace.to_string());
    decision.object_name = decoded
        .as_ref()
        .ok()
        .and_then(|d| d.name().map(str::to_string));
    decision.claim_to_read = decision_claim;
    decision
}

/// A warn-only rule's findings on the answer: as warnings where the mode shows warnings
/// (`enforce`, `warn`), and on the decision for reports, whatever the verdict.
fn add_findings(d: &mut Decision, findings: policy::Findings) {
    if matches!(d.mode, Some(Mode::Enforce | Mode::Warn)) {
        d.warnings.extend(findings.warnings());
    }
    d.findings = findings;
}

/// The exceptions in force for a pod of `namespace` (docs/exceptions.md): none, at the cost of
/// one lookup, where the namespace has none.
pub(crate) fn exceptions_in<'c>(ctx: &Context<'c>, namespace: &str) -> exceptions::InScope<'c> {
    let entries = ctx.caches.index().exceptions_in(namespace);
    if entries.is_empty() {
        return exceptions::InScope::default();
    }
    exceptions::InScope::of(
        entries,
        ctx.namespaces.exceptions_open(namespace),
        ctx.now,
        ctx.config.max_exception_days,
    )
}

/// What the exceptions waived for this workload.
pub(crate) fn uses(w: &Workload) -> Vec<exceptions::ExceptionUse> {
    w.waivers()
        .used
        .iter()
        .map(|e| exceptions::ExceptionUse::of(e))
        .collect()
}

/// An answer that used exceptions says so: a warning each (where the mode shows warnings), the
/// audit annotation `exception` with their names, and the decision's list for the metric.
pub(crate) fn note_exceptions(d: &mut Decision, used: Vec<exceptions::ExceptionUse>) {
    if used.is_empty() || d.mode.is_none_or(|m| m == Mode::Off) {
        return;
    }
    if matches!(d.mode, Some(Mode::Enforce | Mode::Warn)) {
        d.warnings
            .extend(used.iter().map(exceptions::ExceptionUse::warning));
    }
    d.audit_annotations.insert(
        exceptions::AUDIT_KEY,
        policy::listed(used.iter().map(|u| &u.name), ","),
    );
    d.exceptions = used;
}

/// `/validate` of a `ModelgateException` itself (docs/exceptions.md): refused with every
/// problem, naming its field; warned of what it risks. `/mutate` leaves it alone.
fn decide_exception_object(
    webhook: Webhook,
    req: &Request,
    object: Option<&RawValue>,
    ctx: &Context,
) -> Decision {
    let create_or_update =
        matches!(req.operation, "CREATE" | "UPDATE") && req.sub_resource.is_none();
    if webhook == Webhook::Mutate || !create_or_update {
        return Decision::allow();
    }
    let Some(object) = object else {
        return Decision::invalid(format!(
            "request.object is missing on {} of a {}",
            req.operation,
            exceptions::KIND
        ));
    };
    let value: serde_json::Value = match serde_json::from_str(object.get()) {
        Ok(v) => v,
        Err(e) => {
            return Decision::deny(&Denial::single(
                Rule::Schema,
                "request.object",
                format!("cannot be decoded as a {}: {e}", exceptions::KIND),
                DECODE_ADVICE,
            ));
        }
    };
    let spec = value.get("spec").unwrap_or(&serde_json::Value::Null);
    let verdict = exceptions::validate_object(spec, ctx.now, ctx.config.max_exception_days);
    let mut d = if verdict.problems.is_empty() {
        Decision::allow()
    } else {
        Decision::deny(&Denial {
            violations: verdict
                .problems
                .into_iter()
                .map(|p| policy::Violation {
                    rule: Rule::Schema,
                    field: p.field,
                    problem: p.problem,
                    advice: exceptions::ADVICE,
                })
                .collect(),
        })
    };
    d.warnings = verdict.warnings;
    d.object_namespace = Some(req.namespace.clone());
    d.object_name = value
        .pointer("/metadata/name")
        .and_then(serde_json::Value::as_str)
        .map(str::to_string);
    d
}

/// The annotation the kubelet puts on the mirror of a static pod.
pub const MIRROR_POD_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// Objects allowed untouched (docs/policy.md §1), whatever the namespace's mode: those of an exempt
/// namespace, and mirror pods. A mirror pod only reflects a static pod the kubelet runs from a
/// file on its node: the API server cannot change what runs, and refusing the mirror only hides
/// the pod from the cluster.
fn is_exempt(ctx: &Context, namespace: &str, decoded: &Result<DecodedObject, Denial>) -> bool {
    ctx.config.is_exempt(namespace) || decoded.as_ref().is_ok_and(|d| d.is_mirror_pod())
}

/// Where the namespace a decision is made for comes from.
pub(super) enum NamespaceOf {
    /// The request's: the API server's, and the one a decision rests on.
    Request,
    /// The object's, for a request without one (a cluster-scoped kind, a review written by
    /// hand).
    Object,
    /// The object names another namespace than the request: denied, naming the field. The
    /// API server refuses such a create; a decision never rests on what the object claims.
    Mismatch(Denial),
}

pub(super) fn namespace_of(request: &str, object: Option<&str>) -> NamespaceOf {
    match object {
        Some(own) if !request.is_empty() && own != request => {
            let shown = policy::shorten_uri(own, 64);
            NamespaceOf::Mismatch(Denial::single(
                Rule::Schema,
                "metadata.namespace",
                format!("is {shown}, but the request is for namespace {request}"),
                "Create the object in the namespace it names, or leave metadata.namespace unset.",
            ))
        }
        Some(_) if request.is_empty() => NamespaceOf::Object,
        _ => NamespaceOf::Request,
    }
}

/// The policy's verdict for one webhook, as `enforce` applies it; `ephemeral_update` says which
/// containers a `pods/ephemeralcontainers` update judges (`None` for any other request).
fn judge(
    webhook: Webhook,
    ephemeral_update: Option<EphemeralScope>,
    workload: &Workload,
    ctx: &Context,
) -> mode::Verdict {
    match webhook {
        Webhook::Validate => {
            policy::validate(workload, ctx.config, ephemeral_update).map(|()| Mutation::default())
        }
        Webhook::Mutate => match ephemeral_update {
            Some(scope) => policy::mutate_ephemeral(workload, ctx.config, scope),
            None => policy::mutate_create(workload, ctx.config, ctx.caches),
        },
    }
}

/// Validation of the object after the mutation `enforce` would apply (as the API server runs
/// the validating webhook after the mutating one).
fn validate_as_enforced(
    kind: WorkloadKind,
    object: &RawValue,
    ephemeral_update: Option<EphemeralScope>,
    workload: &Workload,
    ctx: &Context,
) -> mode::Verdict {
    let mutation = judge(Webhook::Mutate, ephemeral_update, workload, ctx)?;
    validate_mutated(kind, object, mutation, ephemeral_update, workload, ctx)
}

/// Validation of `object` with `mutation` (computed on it) applied.
fn validate_mutated(
    kind: WorkloadKind,
    object: &RawValue,
    mutation: Mutation,
    ephemeral_update: Option<EphemeralScope>,
    workload: &Workload,
    ctx: &Context,
) -> mode::Verdict {
    if mutation.patch.is_empty() {
        return judge(Webhook::Validate, ephemeral_update, workload, ctx);
    }
    // Applied to the object's text, opening only what the patch touches (`patch::apply`). A
    // patch that passed its bound was not built to the end (in these modes nothing is patched,
    // so the object is judged as it came); one that does not apply would be a bug, and judging
    // the object as it came is the honest fallback.
    let Some(patched) = apply::apply(object.get(), &mutation.patch.into_patch(), "") else {
        return judge(Webhook::Validate, ephemeral_update, workload, ctx);
    };
    let decoded = DecodedObject::decode(kind, &patched)?;
    let workload = decoded.workload(
        workload.namespace,
        workload.restricted_namespace,
        workload.claims,
        workload.exceptions,
    )?;
    judge(Webhook::Validate, ephemeral_update, &workload, ctx)
}

/// The object decoded as the kind the request names, into the views of the fields the rules
/// read (docs/policy.md §6), borrowing from the object's text.
enum DecodedObject<'a> {
    Pod(PodView<'a>),
    Job(JobView<'a>),
}

const DECODE_ADVICE: &str = "Fix the object so that it matches the Kubernetes API schema.";

impl<'a> DecodedObject<'a> {
    fn decode(kind: WorkloadKind, text: &'a str) -> Result<Self, Denial> {
        let fail = |field: String, problem: String| {
            Denial::single(Rule::Schema, field, problem, DECODE_ADVICE)
        };
        if !text.trim_start().starts_with('{') {
            return Err(fail(
                "request.object".into(),
                format!("cannot be decoded as a {}: not an object", kind.as_str()),
            ));
        }
        let decoded = match kind {
            WorkloadKind::Pod => view::decode_pod(text).map(DecodedObject::Pod),
            _ => view::decode_job(text).map(DecodedObject::Job),
        };
        let decoded = decoded.map_err(|failure| {
            if failure.too_large {
                return mode::too_large(&failure.path, &failure);
            }
            // Both may quote the object (a map key in the path, a string value in the message):
            // shortened, so that a message never grows with what the request put there.
            let field = if failure.path == "." {
                "request.object".to_string()
            } else {
                policy::shorten_uri(&failure.path, MAX_WARNING_LEN).into_owned()
            };
            fail(
                field,
                format!(
                    "cannot be decoded as a {}: {}",
                    kind.as_str(),
                    policy::shorten_uri(&failure.message, MAX_WARNING_LEN)
                ),
            )
        })?;
        decoded.of_kind(kind)
    }

    /// The object, when its own `kind` (if it says one) is the request's.
    fn of_kind(self, kind: WorkloadKind) -> Result<Self, Denial> {
        let found = match &self {
            DecodedObject::Pod(p) => p.kind.as_deref(),
            DecodedObject::Job(j) => j.kind.as_deref(),
        };
        if let Some(found) = found
            && found != kind.as_str()
        {
            return Err(Denial::single(
                Rule::Schema,
                "request.object.kind",
                format!(
                    "the object is a {found}, but the request is for a {}",
                    kind.as_str()
                ),
                DECODE_ADVICE,
            ));
        }
        Ok(self)
    }

    fn metadata(&self) -> Option<&ObjectMetaView<'a>> {
        match self {
            DecodedObject::Pod(p) => p.metadata.as_ref(),
            DecodedObject::Job(j) => j.metadata.as_ref(),
        }
    }

    fn is_mirror_pod(&self) -> bool {
        matches!(self, DecodedObject::Pod(_))
            && self
                .metadata()
                .and_then(|m| m.annotations.as_ref())
                .is_some_and(|a| a.contains_key(MIRROR_POD_ANNOTATION))
    }

    fn namespace(&self) -> Option<&str> {
        self.metadata()?
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
    }

    /// The name, else the `generateName` prefix.
    fn name(&self) -> Option<&str> {
        let meta = self.metadata()?;
        meta.name
            .as_deref()
            .filter(|n| !n.is_empty())
            .or(meta.generate_name.as_deref())
    }

    /// Where the pod's metadata and spec are: `metadata`/`spec` of a Pod,
    /// `spec.template.metadata`/`spec.template.spec` of a Job. Denials name fields under these.
    fn pod_paths(&self) -> (FieldPath, FieldPath) {
        let root = match self {
            DecodedObject::Pod(_) => FieldPath::root(),
            DecodedObject::Job(_) => FieldPath::root().keys(["spec", "template"]),
        };
        (root.key("metadata"), root.key("spec"))
    }

    /// The pod template of a Job, with the path of its spec for a denial that it is missing.
    fn template(
        &self,
    ) -> (
        Option<&PodTemplateOf<'a, view::InitContainerView<'a>>>,
        &'static str,
    ) {
        match self {
            DecodedObject::Pod(_) => (None, "spec"),
            DecodedObject::Job(j) => (
                j.spec.as_ref().and_then(|s| s.template.as_ref()),
                "spec.template.spec",
            ),
        }
    }

    /// The pod the rules judge: the Pod itself, or the pod template of a Job,
    /// with the paths of its metadata and spec inside the object.
    fn workload<'w>(
        &'w self,
        namespace: &'w str,
        restricted_namespace: bool,
        claims: impl Into<Option<&'w crate::cache::CacheIndex>>,
        exceptions: exceptions::InScope<'w>,
    ) -> Result<Workload<'w>, Denial> {
        let missing =
            |field: &str| Denial::single(Rule::Schema, field, "is missing", DECODE_ADVICE);
        let (meta_path, spec_path) = self.pod_paths();
        let own = match self {
            DecodedObject::Pod(p) => p.metadata.as_ref(),
            DecodedObject::Job(j) => j.metadata.as_ref(),
        };
        let (metadata, spec) = match (self, self.template()) {
            (DecodedObject::Pod(p), (_, spec_field)) => (
                p.metadata.as_ref(),
                p.spec.as_ref().ok_or_else(|| missing(spec_field))?,
            ),
            (_, (template, spec_field)) => (
                template.and_then(|t| t.metadata.as_ref()),
                template
                    .and_then(|t| t.spec.as_ref())
                    .ok_or_else(|| missing(spec_field))?,
            ),
        };
        Ok(Workload {
            namespace,
            restricted_namespace,
            claims: claims.into(),
            prep_withheld: Default::default(),
            annotations: metadata.and_then(|m| m.annotations.as_ref()),
            object_annotations: own.and_then(|m| m.annotations.as_ref()),
            labels: metadata.and_then(|m| m.labels.as_ref()),
            has_metadata: metadata.is_some(),
            spec,
            meta_path,
            spec_path,
            exceptions,
            waivers: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod mode_tests;

#[cfg(test)]
mod controller_tests;

#[cfg(test)]
mod template_tests;

#[cfg(test)]
mod bound_tests;

#[cfg(test)]
mod ephemeral_tests;

#[cfg(test)]
mod claim_tests;

#[cfg(test)]
mod exception_tests;
