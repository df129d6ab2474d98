//! Exceptions granted through RBAC (docs/exceptions.md): a `ModelgateException` lets the pods
//! its selector matches break one or two rules (`non-root`, `cache-prep`) for a while.
//!
//! This module holds what needs no I/O: the object's own checks (those the CRD's
//! `x-kubernetes-validations` make, and those that need a clock, which `/validate` of the object
//! makes), its conversion into what the cache index keeps per namespace, and the decision
//! whether one applies to a pod or template and which of its containers it covers. The clock is
//! the caller's: [`crate::admission::Context::now`].
//!
//! An exception is honoured only when all of these hold at the moment of the decision:
//! - its namespace carries the label `modelgate.io/exceptions: allowed`;
//! - `now ≤ expires ≤ creationTimestamp + max days` (an object without a creation time, as
//!   written in a file, counts as created now);
//! - its selector pins at least one label to a value (`matchLabels`, or an `In` expression)
//!   and matches the pod's labels;
//! - for `non-root`, per container: `containers` names it (or is absent) and, when `images` is
//!   given, the container's image is one of the patterns (exact, or a prefix ending in `*`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::policy::view::StrMap;

pub const GROUP: &str = "modelgate.io";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "modelgate.io/v1alpha1";
pub const KIND: &str = "ModelgateException";
pub const PLURAL: &str = "modelgateexceptions";
/// The namespace label that opens a namespace for exceptions, and its one value that does.
pub const NAMESPACE_LABEL: &str = "modelgate.io/exceptions";
pub const ALLOWED: &str = "allowed";
/// The longest `spec.reason`, in characters.
pub const MAX_REASON_LEN: usize = 1024;
/// `--max-exception-days`' default.
pub const DEFAULT_MAX_DAYS: u32 = 90;
/// The audit annotation of an admission that used an exception (the API server prefixes it
/// with the webhook's name: `validate.modelgate.io/exception`).
pub const AUDIT_KEY: &str = "exception";
/// The most entries kept in a list of an exception (`containers`, `images`, selector terms):
/// what a decision walks stays small whatever the object says.
pub const MAX_LIST: usize = 64;

const DAY: i64 = 86_400;

/// What a refused exception object is told to do.
pub const ADVICE: &str = "Fix the ModelgateException: a reason, an expiry within \
     --max-exception-days, rules among non-root and cache-prep, and a selector that names the \
     workload's labels (docs/exceptions.md).";

/// An exception a decision used, as the answer and the reports name it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExceptionUse {
    pub name: String,
    pub rules: Vec<Waivable>,
    pub expires: String,
}

impl ExceptionUse {
    pub fn of(e: &Exception) -> Self {
        ExceptionUse {
            name: e.name.to_string(),
            rules: e.rules.to_vec(),
            expires: e.expires_text.to_string(),
        }
    }

    /// `exception vendor-root waives non-root until 2027-01-01T00:00:00Z`.
    pub fn warning(&self) -> String {
        let rules: Vec<&str> = self.rules.iter().map(|r| r.as_str()).collect();
        format!(
            "exception {} waives {} until {}",
            crate::policy::shorten_uri(&self.name, 80),
            rules.join(", "),
            crate::policy::shorten_uri(&self.expires, 40)
        )
    }

    pub fn waives(&self, rule: Waivable) -> bool {
        self.rules.contains(&rule)
    }
}

/// A rule an exception can waive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Waivable {
    /// The forcing of non-root users and the `runAsNonRoot`/`runAsUser` checks, for the
    /// matched containers.
    NonRoot,
    /// The `model-cache-prep` init container, for the pod.
    CachePrep,
}

impl Waivable {
    pub const ALL: [Waivable; 2] = [Waivable::NonRoot, Waivable::CachePrep];

    pub fn as_str(self) -> &'static str {
        match self {
            Waivable::NonRoot => "non-root",
            Waivable::CachePrep => "cache-prep",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Waivable::ALL.into_iter().find(|w| w.as_str() == s)
    }
}

impl fmt::Display for Waivable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem of an exception object, naming its field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub problem: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

fn problem(field: impl Into<String>, problem: impl Into<String>) -> Problem {
    Problem {
        field: field.into(),
        problem: problem.into(),
    }
}

/// The spec as written, every field optional so that each missing one is named.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecInput {
    reason: Option<String>,
    expires: Option<String>,
    rules: Option<Vec<String>>,
    selector: Option<SelectorInput>,
    containers: Option<Vec<String>>,
    images: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SelectorInput {
    match_labels: Option<BTreeMap<String, String>>,
    match_expressions: Option<Vec<RequirementInput>>,
}

#[derive(Debug, Default, Deserialize)]
struct RequirementInput {
    key: Option<String>,
    operator: Option<String>,
    values: Option<Vec<String>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: Box<str>,
    operator: Operator,
    values: Box<[Box<str>]>,
}

/// A label selector as Kubernetes evaluates it: every `matchLabels` pair and every expression.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Box<[(Box<str>, Box<str>)]>,
    expressions: Box<[Requirement]>,
}

impl Selector {
    /// Whether the selector pins at least one label to a value: without that it is broad
    /// (`Exists`, `NotIn`, `DoesNotExist` alone match pods nobody named) and never matches.
    fn pins(&self) -> bool {
        !self.labels.is_empty() || self.expressions.iter().any(|e| e.operator == Operator::In)
    }

    /// Whether the selector matches `labels` (a pod's or template's). A selector that pins no
    /// label matches nothing.
    pub fn matches(&self, labels: Option<&StrMap>) -> bool {
        if !self.pins() {
            return false;
        }
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.labels.iter().all(|(k, v)| get(k) == Some(&**v))
            && self.expressions.iter().all(|e| {
                let value = get(&e.key);
                match e.operator {
                    Operator::In => value.is_some_and(|v| e.values.iter().any(|x| **x == *v)),
                    Operator::NotIn => value.is_none_or(|v| !e.values.iter().any(|x| **x == *v)),
                    Operator::Exists => value.is_some(),
                    Operator::DoesNotExist => value.is_none(),
                }
            })
    }
}

/// An image pattern: exact, or a prefix when it ends in `*` (the only place a `*` may be).
fn image_matches(pattern: &str, image: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => image.starts_with(prefix),
        None => image == pattern,
    }
}

/// An exception as the index keeps it: checked once, when it arrives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exception {
    pub namespace: Arc<str>,
    pub name: Arc<str>,
    /// `metadata.creationTimestamp`, Unix seconds; `None` for an object written in a file.
    pub created: Option<i64>,
    /// `spec.expires`, Unix seconds.
    pub expires: i64,
    /// `spec.expires` as written.
    pub expires_text: Box<str>,
    pub rules: Box<[Waivable]>,
    pub selector: Selector,
    /// `spec.containers`, sorted and without duplicates (each container's question is a
    /// binary search): `None` for all.
    pub containers: Option<Box<[Box<str>]>>,
    /// `spec.images`: `None` for any image.
    pub images: Option<Box<[Box<str>]>>,
    /// `status` as the object holds it (`serve` writes it), when it has a well-formed one.
    pub status: Option<Status>,
}

/// An exception's `status`: whether it is in force, and why (not). `serve` writes it; the
/// decisions never read it (they decide by [`Exception::in_force`] at the moment of use).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub in_force: bool,
    pub reason: Box<str>,
}

impl Status {
    /// `status` of an object, if it has a well-formed one.
    pub fn from_object(status: Option<&Value>) -> Option<Status> {
        let status = status?;
        Some(Status {
            in_force: status.get("inForce")?.as_bool()?,
            reason: status.get("reason")?.as_str()?.into(),
        })
    }

    pub fn to_json(&self) -> Value {
        serde_json::json!({"inForce": self.in_force, "reason": &*self.reason})
    }
}

/// Why an exception that matches is not in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotInForce {
    /// Its namespace is not labelled `modelgate.io/exceptions: allowed`.
    ClosedNamespace,
    /// `expires` has passed.
    Expired,
    /// `expires` is later than its creation plus the longest allowed.
    TooLong,
    /// No clock was given to the decision.
    NoClock,
}

impl NotInForce {
    pub fn as_str(self) -> &'static str {
        match self {
            NotInForce::ClosedNamespace => "namespace-closed",
            NotInForce::Expired => "expired",
            NotInForce::TooLong => "too-long",
            NotInForce::NoClock => "no-clock",
        }
    }
}

impl Exception {
    pub fn waives(&self, rule: Waivable) -> bool {
        self.rules.contains(&rule)
    }

    /// Whether it is in force at `now` (Unix seconds) under a limit of `max_days`.
    pub fn in_force(&self, now: i64, max_days: u32) -> Result<(), NotInForce> {
        if now > self.expires {
            return Err(NotInForce::Expired);
        }
        let created = self.created.unwrap_or(now);
        if self.expires > created.saturating_add(i64::from(max_days) * DAY) {
            return Err(NotInForce::TooLong);
        }
        Ok(())
    }

    /// Whether it covers a container of this name running this image (the selector aside).
    pub fn covers(&self, name: &str, image: Option<&str>) -> bool {
        let named = self
            .containers
            .as_ref()
            .is_none_or(|c| c.binary_search_by(|n| (**n).cmp(name)).is_ok());
        let imaged = match &self.images {
            None => true,
            Some(patterns) => image.is_some_and(|i| patterns.iter().any(|p| image_matches(p, i))),
        };
        named && imaged
    }

    /// What its `status` says at `now` (Unix seconds) under a limit of `max_days`, its
    /// namespace `open` for exceptions or not (docs/exceptions.md, "Status"). The object's own
    /// limits first: an expired exception stays expired whatever its namespace.
    pub fn status_at(&self, open: bool, now: i64, max_days: u32) -> Status {
        let (in_force, reason) = match self.in_force(now, max_days) {
            Err(NotInForce::Expired) => (false, format!("expired at {}", self.expires_text)),
            Err(NotInForce::TooLong) => (
                false,
                format!(
                    "never in force: spec.expires ({}) is more than {max_days} days after its \
                     creation (--max-exception-days)",
                    self.expires_text
                ),
            ),
            _ if !open => (
                false,
                format!(
                    "not in force: namespace {} is not open for exceptions (it lacks the label \
                     {NAMESPACE_LABEL}: {ALLOWED})",
                    self.namespace
                ),
            ),
            _ => (true, format!("in force until {}", self.expires_text)),
        };
        Status {
            in_force,
            reason: reason.into(),
        }
    }

    /// `ns/name`.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Converts an exception object (JSON); the error says why it can never be honoured.
    pub fn from_object(value: &Value) -> Result<Exception, String> {
        let meta = |k: &str| {
            value
                .pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        };
        let created = match meta("creationTimestamp") {
            None => None,
            Some(t) => Some(parse_time(t).ok_or_else(|| {
                format!("metadata.creationTimestamp {t:?} is not an RFC 3339 time")
            })?),
        };
        let exception = Exception::from_parts(
            meta("name"),
            meta("namespace"),
            created,
            value.get("spec").unwrap_or(&Value::Null),
        )?;
        Ok(Exception {
            status: Status::from_object(value.get("status")),
            ..exception
        })
    }

    /// [`Exception::from_object`] from the object's parts.
    pub fn from_parts(
        name: Option<&str>,
        namespace: Option<&str>,
        created: Option<i64>,
        spec: &Value,
    ) -> Result<Exception, String> {
        let name = name
            .filter(|n| !n.is_empty())
            .ok_or("has no metadata.name")?;
        let namespace = namespace
            .filter(|n| !n.is_empty())
            .ok_or("has no metadata.namespace")?;
        let checked = check_spec(spec);
        if let Some(p) = checked.problems.first() {
            return Err(p.to_string());
        }
        let spec = checked.spec.ok_or("spec.expires: is missing")?;
        Ok(Exception {
            namespace: namespace.into(),
            name: name.into(),
            created,
            ..spec
        })
    }
}

/// The checks that need no clock: what the CRD's `x-kubernetes-validations` refuse as well, so
/// that an object stored while they were not installed is never honoured either.
struct Checked {
    spec: Option<Exception>,
    problems: Vec<Problem>,
    warnings: Vec<String>,
}

fn check_spec(spec: &Value) -> Checked {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let input: SpecInput = match spec {
        Value::Null => {
            problems.push(problem("spec", "is missing"));
            SpecInput::default()
        }
        v => match serde_json::from_value(v.clone()) {
            Ok(s) => s,
            Err(e) => {
                problems.push(problem("spec", format!("does not decode: {e}")));
                return Checked {
                    spec: None,
                    problems,
                    warnings,
                };
            }
        },
    };
    match input.reason.as_deref().map(str::trim) {
        None => problems.push(problem(
            "spec.reason",
            "is missing: say why the workload may break the rule",
        )),
        Some("") => problems.push(problem("spec.reason", "is empty")),
        Some(r) if r.chars().count() > MAX_REASON_LEN => problems.push(problem(
            "spec.reason",
            format!("has more than {MAX_REASON_LEN} characters"),
        )),
        Some(_) => {}
    }
    let expires = match input.expires.as_deref() {
        None => {
            problems.push(problem("spec.expires", "is missing"));
            None
        }
        Some(t) => match parse_time(t) {
            Some(s) => Some((s, t)),
            None => {
                problems.push(problem(
                    "spec.expires",
                    format!(
                        "{:?} is not an RFC 3339 time (2026-12-31T00:00:00Z)",
                        crate::policy::shorten_uri(t, 64)
                    ),
                ));
                None
            }
        },
    };
    let mut rules = Vec::new();
    match &input.rules {
        None => problems.push(problem("spec.rules", "is missing")),
        Some(r) if r.is_empty() => problems.push(problem(
            "spec.rules",
            "is empty: name non-root, cache-prep or both",
        )),
        Some(r) => {
            for (i, s) in r.iter().enumerate() {
                match Waivable::parse(s) {
                    Some(w) if !rules.contains(&w) => rules.push(w),
                    Some(_) => {}
                    None => problems.push(problem(
                        format!("spec.rules[{i}]"),
                        format!(
                            "{:?} is not one of non-root, cache-prep",
                            crate::policy::shorten_uri(s, 64)
                        ),
                    )),
                }
            }
        }
    }
    rules.sort();
    let selector = check_selector(input.selector.as_ref(), &mut problems);
    let list = |field: &str, items: &Option<Vec<String>>, problems: &mut Vec<Problem>| {
        let items = items.as_ref()?;
        if items.is_empty() {
            problems.push(problem(field, "is empty: leave it out instead"));
        }
        if items.len() > MAX_LIST {
            problems.push(problem(field, format!("has more than {MAX_LIST} entries")));
        }
        for (i, s) in items.iter().enumerate() {
            if s.is_empty() {
                problems.push(problem(format!("{field}[{i}]"), "is empty"));
            }
        }
        Some(
            items
                .iter()
                .map(|s| Box::<str>::from(s.as_str()))
                .collect::<Box<[_]>>(),
        )
    };
    let containers = list("spec.containers", &input.containers, &mut problems).map(|names| {
        let mut names = names.into_vec();
        names.sort_unstable();
        names.dedup();
        names.into_boxed_slice()
    });
    let images = list("spec.images", &input.images, &mut problems);
    for (i, p) in input.images.iter().flatten().enumerate() {
        if p.trim_end_matches('*').contains('*') || p.matches('*').count() > 1 {
            problems.push(problem(
                format!("spec.images[{i}]"),
                format!(
                    "{:?} has a * that is not its last character (exact images, or a prefix \
                     ending in *)",
                    crate::policy::shorten_uri(p, 64)
                ),
            ));
        }
    }
    if rules.contains(&Waivable::NonRoot) && images.is_none() {
        warnings.push(
            "spec.images is not set: the non-root exception covers any image a pod with these \
             labels runs; pin the images (a digest: image@sha256:…)"
                .to_string(),
        );
    }
    let spec = expires.map(|(expires, text)| Exception {
        namespace: "".into(),
        name: "".into(),
        created: None,
        expires,
        expires_text: text.into(),
        rules: rules.into(),
        selector,
        containers,
        images,
        status: None,
    });
    Checked {
        spec,
        problems,
        warnings,
    }
}

fn check_selector(input: Option<&SelectorInput>, problems: &mut Vec<Problem>) -> Selector {
    let Some(input) = input else {
        problems.push(problem("spec.selector", "is missing"));
        return Selector::default();
    };
    let labels: Box<[_]> = input
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| (Box::<str>::from(k.as_str()), Box::<str>::from(v.as_str())))
        .collect();
    let mut expressions = Vec::new();
    for (i, e) in input.match_expressions.iter().flatten().enumerate() {
        let at = format!("spec.selector.matchExpressions[{i}]");
        let key = e.key.as_deref().unwrap_or_default();
        if key.is_empty() {
            problems.push(problem(format!("{at}.key"), "is missing"));
        }
        let values = e.values.as_deref().unwrap_or_default();
        let operator = match e.operator.as_deref() {
            Some("In") => Operator::In,
            Some("NotIn") => Operator::NotIn,
            Some("Exists") => Operator::Exists,
            Some("DoesNotExist") => Operator::DoesNotExist,
            other => {
                problems.push(problem(
                    format!("{at}.operator"),
                    format!(
                        "{:?} is not one of In, NotIn, Exists, DoesNotExist",
                        other.unwrap_or_default()
                    ),
                ));
                continue;
            }
        };
        match operator {
            Operator::In | Operator::NotIn if values.is_empty() => {
                problems.push(problem(format!("{at}.values"), "is empty"));
            }
            Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
                problems.push(problem(
                    format!("{at}.values"),
                    "must be empty for Exists and DoesNotExist",
                ));
            }
            _ => {}
        }
        expressions.push(Requirement {
            key: key.into(),
            operator,
            values: values
                .iter()
                .map(|v| Box::<str>::from(v.as_str()))
                .collect(),
        });
    }
    if labels.len() + expressions.len() > MAX_LIST {
        problems.push(problem(
            "spec.selector",
            format!("has more than {MAX_LIST} terms"),
        ));
    }
    let selector = Selector {
        labels,
        expressions: expressions.into(),
    };
    if selector.labels.is_empty() && selector.expressions.is_empty() {
        problems.push(problem(
            "spec.selector",
            "is empty: it would match every pod of the namespace; select the workload's labels",
        ));
    } else if !selector.pins() {
        problems.push(problem(
            "spec.selector",
            "pins no label to a value (only Exists, NotIn or DoesNotExist): it would match pods \
             nobody named; use matchLabels or an In expression",
        ));
    }
    selector
}

/// What `/validate` of a `ModelgateException` says: the problems that refuse it, and warnings.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ObjectVerdict {
    pub problems: Vec<Problem>,
    pub warnings: Vec<String>,
}

/// `/validate` of an exception object's `spec` at `now`: the checks without a clock, then
/// `expires` at most `max_days` ahead (a past `expires` is only warned of: the object is
/// inert, and deleting it must stay possible).
pub fn validate_object(spec: &Value, now: Option<i64>, max_days: u32) -> ObjectVerdict {
    let checked = check_spec(spec);
    let mut verdict = ObjectVerdict {
        problems: checked.problems,
        warnings: checked.warnings,
    };
    if let (Some(s), Some(now)) = (&checked.spec, now) {
        if s.expires > now.saturating_add(i64::from(max_days) * DAY) {
            verdict.problems.push(problem(
                "spec.expires",
                format!(
                    "{} is more than {max_days} days ahead (--max-exception-days)",
                    s.expires_text
                ),
            ));
        } else if s.expires < now {
            verdict.warnings.push(format!(
                "spec.expires: {} has passed: the exception is not in force",
                s.expires_text
            ));
        }
    }
    verdict
}

/// Whether a namespace's labels open it for exceptions.
pub fn is_open(value: Option<&str>) -> bool {
    value == Some(ALLOWED)
}

/// Whether a document is a `ModelgateException`.
pub fn is_exception(value: &Value) -> bool {
    value.get("kind").and_then(Value::as_str) == Some(KIND)
        && value
            .get("apiVersion")
            .and_then(Value::as_str)
            .is_none_or(|a| a.starts_with("modelgate.io/"))
}

/// Parses an RFC 3339 time (`2026-12-31T00:00:00Z`, `…T01:00:00.5+01:00`) into Unix seconds
/// (fractions dropped).
pub fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let ob = rest.as_bytes();
            if ob.len() != 6 || !matches!(ob[0], b'+' | b'-') || ob[3] != b':' {
                return None;
            }
            let h: i64 = rest.get(1..3)?.parse().ok()?;
            let m: i64 = rest.get(4..6)?.parse().ok()?;
            if h > 23 || m > 59 {
                return None;
            }
            let sign = if ob[0] == b'-' { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
    };
    let days = days_from_civil(year, month, day);
    Some(days * DAY + hour * 3600 + minute * 60 + second - offset)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The exceptions a decision may use: those of the pod's namespace, with the clock and the
/// limit. Empty (and free) in a namespace not open for exceptions, or without a clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct InScope<'a> {
    pub entries: &'a [Arc<Exception>],
    pub now: i64,
    pub max_days: u32,
}

impl<'a> InScope<'a> {
    /// Those of `namespace` in force at `now`, if it is open.
    pub fn of(
        entries: &'a [Arc<Exception>],
        open: bool,
        now: Option<i64>,
        max_days: u32,
    ) -> InScope<'a> {
        match now {
            Some(now) if open && !entries.is_empty() => InScope {
                entries,
                now,
                max_days,
            },
            _ => InScope::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The exceptions in force whose selector matches `labels`.
    pub fn matching<'s>(
        &'s self,
        labels: Option<&'s StrMap<'_>>,
    ) -> impl Iterator<Item = &'a Exception> + 's {
        self.entries
            .iter()
            .map(|e| &**e)
            .filter(move |e| e.in_force(self.now, self.max_days).is_ok())
            .filter(move |e| e.selector.matches(labels))
    }
}

#[cfg(test)]
mod tests;
