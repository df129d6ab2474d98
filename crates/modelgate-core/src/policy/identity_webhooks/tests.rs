//! The skip annotations: each read as its webhook reads it, the prep added once, every name
//! kept, the map created when missing, a second pass empty, hostile values in linear time.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::admission::Webhook;
use crate::cache::CacheIndex;
use crate::config::PolicyConfig;
use crate::policy::Rule;
use crate::testing;

const AZURE: &SkipAnnotation = &SKIP_ANNOTATIONS[0];
const EKS: &SkipAnnotation = &SKIP_ANNOTATIONS[1];

/// A first record, collected: its fields and where it ended.
type Record = Result<(Vec<String>, RecordEnd), NoRecord>;

/// The first record as Go's reader returns it, collected.
fn record(text: &str) -> Record {
    let mut fields = Vec::new();
    let end = go_csv_first_record(text, |f| fields.push(f.to_string()))?;
    Ok((fields, end))
}

/// The names the EKS webhook skips for `value` (none when its reader refuses it).
fn eks_names(value: &str) -> Vec<String> {
    record(value).map(|(f, _)| f).unwrap_or_default()
}

/// The names the Azure webhook skips for `value`.
fn azure_names(value: &str) -> Vec<String> {
    if value.is_empty() {
        return Vec::new();
    }
    value.split(';').map(|n| n.trim().to_string()).collect()
}

#[test]
fn the_annotations_are_the_webhooks_own() {
    // pkg/handler/handler.go: annotationDomain + "/" + pkg.SkipContainersAnnotation, with the
    // default domain of main.go; pkg/webhook/consts.go: SkipContainersAnnotation.
    assert_eq!(EKS.key, "eks.amazonaws.com/skip-containers");
    assert_eq!(AZURE.key, "azure.workload.identity/skip-containers");
    assert!(AZURE.key < EKS.key, "in key order");
}

/// Cases of Go's `encoding/csv` `Reader.Read` with its defaults (src/encoding/csv/reader.go,
/// `readRecord`), one per branch of it. These, and every value of the exhaustive test below
/// with whether `,model-cache-prep` appends exactly one name, were compared with Go 1.19's
/// reader when this was written.
#[test]
fn the_eks_value_is_read_as_gos_csv_reader_reads_its_first_record() {
    use RecordEnd::{EndOfText, LineBreak};
    let ok = |fields: &[&str], end| Ok((fields.iter().map(|f| f.to_string()).collect(), end));
    let cases: &[(&str, Record)] = &[
        ("a,b", ok(&["a", "b"], EndOfText)),
        // No trimming: the name is " b".
        ("a, b", ok(&["a", " b"], EndOfText)),
        ("a,", ok(&["a", ""], EndOfText)),
        (",", ok(&["", ""], EndOfText)),
        // Empty lines before the record are skipped; only the first record is read.
        ("\n\na,b\nc", ok(&["a", "b"], LineBreak)),
        ("\r\n a", ok(&[" a"], EndOfText)),
        ("a\r\n", ok(&["a"], LineBreak)),
        // A `\r` before the end of the text is dropped; one inside a line is kept.
        ("a\r", ok(&["a"], EndOfText)),
        ("a\rb", ok(&["a\rb"], EndOfText)),
        ("\"a,b\",c", ok(&["a,b", "c"], EndOfText)),
        ("\"a\"\"b\"", ok(&["a\"b"], EndOfText)),
        ("\"\"", ok(&[""], EndOfText)),
        ("\"a\"\n", ok(&["a"], LineBreak)),
        ("\"a\nb\",c", ok(&["a\nb", "c"], EndOfText)),
        ("\"a\r\nb\"", ok(&["a\nb"], EndOfText)),
        ("\"a\n\nb\"", ok(&["a\n\nb"], EndOfText)),
        ("é,\"ü\"", ok(&["é", "ü"], EndOfText)),
        // ErrBareQuote, ErrQuote, an unclosed quote, no record at all.
        ("a\"b", Err(NoRecord)),
        ("x,a\"", Err(NoRecord)),
        ("\"a\"b", Err(NoRecord)),
        ("\"a\" ,b", Err(NoRecord)),
        ("\"ab", Err(NoRecord)),
        ("\"ab\n", Err(NoRecord)),
        ("\"ab\r", Err(NoRecord)),
        ("", Err(NoRecord)),
        ("\n\n", Err(NoRecord)),
        ("\r", Err(NoRecord)),
    ];
    for (text, expected) in cases {
        assert_eq!(&record(text), expected, "{text:?}");
    }
}

#[test]
fn a_missing_or_empty_annotation_becomes_the_prep_alone() {
    for a in &SKIP_ANNOTATIONS {
        for old in [None, Some("")] {
            assert_eq!(
                with_prep(a, old),
                Some(NewValue {
                    value: PREP_CONTAINER.into(),
                    rewritten: false
                }),
                "{} {old:?}",
                a.key
            );
        }
    }
}

#[test]
fn the_prep_is_appended_with_the_webhooks_separator_keeping_the_text() {
    let appended = |a, old: &str| with_prep(a, Some(old)).map(|n| (n.value, n.rewritten));
    let kept = |v: &str| Some((v.to_string(), false));
    assert_eq!(appended(EKS, "sidecar"), kept("sidecar,model-cache-prep"));
    assert_eq!(
        appended(EKS, "init-first,\"side car\""),
        kept("init-first,\"side car\",model-cache-prep")
    );
    assert_eq!(appended(EKS, "a,"), kept("a,,model-cache-prep"));
    assert_eq!(appended(AZURE, "sidecar"), kept("sidecar;model-cache-prep"));
    assert_eq!(appended(AZURE, "a;"), kept("a;model-cache-prep"));
    assert_eq!(appended(AZURE, "a; "), kept("a; model-cache-prep"));
    assert_eq!(appended(AZURE, " "), kept(" ;model-cache-prep"));
}

#[test]
fn whitespace_counts_as_each_webhook_reads_it() {
    // Azure trims each name: the prep is already there.
    for old in [
        "model-cache-prep",
        " model-cache-prep ",
        "a; model-cache-prep",
        "a;\tmodel-cache-prep\u{a0};b",
        ";model-cache-prep;",
    ] {
        assert_eq!(with_prep(AZURE, Some(old)), None, "{old:?}");
    }
    // EKS does not trim: " model-cache-prep" is another name, and the prep is added.
    for old in [
        "model-cache-prep",
        "a,model-cache-prep",
        "\"model-cache-prep\",b",
    ] {
        assert_eq!(with_prep(EKS, Some(old)), None, "{old:?}");
    }
    assert_eq!(
        with_prep(EKS, Some("a, model-cache-prep")).map(|n| n.value),
        Some("a, model-cache-prep,model-cache-prep".into())
    );
    // The second line is not read by the webhook: the prep there does not count.
    assert!(with_prep(EKS, Some("a\nmodel-cache-prep")).is_some());
    // A value the reader refuses skips nothing, the prep included.
    assert!(with_prep(EKS, Some("model-cache-prep,a\"b")).is_some());
}

#[test]
fn an_eks_value_its_webhook_cannot_read_to_the_end_is_rewritten_as_the_names_it_read() {
    let rewritten = |old: &str| with_prep(EKS, Some(old)).map(|n| (n.value, n.rewritten));
    let said = |v: &str| Some((v.to_string(), true));
    // More lines: only the first is read, so the prep goes into it.
    assert_eq!(rewritten("a,b\nc"), said("a,b,model-cache-prep"));
    assert_eq!(rewritten("a\n"), said("a,model-cache-prep"));
    assert_eq!(rewritten("a\r"), said("a,model-cache-prep"));
    // Names that no container can have (not a DNS label) match nothing: left out.
    assert_eq!(
        rewritten("a,\"Side Car\",,b-1\n"),
        said("a,b-1,model-cache-prep")
    );
    // Refused: the webhook skipped nothing.
    assert_eq!(rewritten("a,b\"c"), said("model-cache-prep"));
    assert_eq!(rewritten("\"a"), said("model-cache-prep"));
    // Nothing to keep: no warning.
    assert_eq!(
        rewritten("\n"),
        Some(("model-cache-prep".to_string(), false))
    );
    let warning = rewritten_warning(EKS);
    assert!(warning.len() <= crate::policy::MAX_WARNING_LEN, "{warning}");
}

/// Every value of up to five tokens: the new value names the prep as the webhook reads it,
/// keeps every name the webhook read that a container can have (all of them, in order, when
/// the text is kept), and a second pass leaves it.
#[test]
fn every_short_value_ends_naming_the_prep_and_every_name_it_had() {
    const TOKENS: [&str; 9] = ["a", "b-1", ",", ";", "\"", "\n", "\r", " ", PREP_CONTAINER];
    let mut values = vec![String::new()];
    let mut all = Vec::new();
    for _ in 0..5 {
        let mut next = Vec::with_capacity(values.len() * TOKENS.len());
        for v in &values {
            for t in TOKENS {
                next.push(format!("{v}{t}"));
            }
        }
        all.extend(values);
        values = next;
    }
    all.extend(values);
    for old in &all {
        for (a, names) in [
            (EKS, eks_names as fn(&str) -> Vec<String>),
            (AZURE, azure_names),
        ] {
            let before = names(old);
            let Some(new) = with_prep(a, Some(old)) else {
                assert!(before.iter().any(|n| n == PREP_CONTAINER), "{old:?}");
                continue;
            };
            let after = names(&new.value);
            assert!(
                after.iter().any(|n| n == PREP_CONTAINER),
                "{}: {old:?} -> {:?}",
                a.key,
                new.value
            );
            let names_of = |v: &[String]| -> Vec<String> {
                v.iter().filter(|n| is_container_name(n)).cloned().collect()
            };
            if new.value.starts_with(old.as_str()) {
                // The text kept: the same names, then the prep (EKS: exactly; Azure: but for
                // an empty last name, which the separator already there now ends).
                let mut expected = names_of(&before);
                expected.push(PREP_CONTAINER.to_string());
                assert_eq!(names_of(&after), expected, "{}: {old:?}", a.key);
                if a.key == EKS.key {
                    let mut exact = before.clone();
                    exact.push(PREP_CONTAINER.to_string());
                    assert_eq!(after, exact, "{old:?}");
                }
            } else {
                assert_eq!(a.key, EKS.key, "only EKS values are rewritten: {old:?}");
                for n in before.iter().filter(|n| is_container_name(n)) {
                    assert!(after.contains(n), "{old:?} -> {:?} lost {n:?}", new.value);
                }
            }
            assert_eq!(with_prep(a, Some(&new.value)), None, "{old:?} twice");
        }
    }
}

#[test]
fn hostile_values_cost_one_pass() {
    // A megabyte of names, and a hundred thousand of them, for each path: appended (EKS,
    // Azure) and rewritten (EKS, the names then more lines).
    let names: Vec<String> = (0..100_000).map(|i| format!("c{i}")).collect();
    let long = format!("{},x", "n".repeat(1 << 20));
    let eks = names.join(",");
    let azure = names.join(";");
    let more_lines = format!("{eks}\n{}", "\"".repeat(1 << 20));
    for (a, old) in [
        (EKS, eks.as_str()),
        (EKS, long.as_str()),
        (EKS, more_lines.as_str()),
        (AZURE, azure.as_str()),
        (AZURE, long.as_str()),
    ] {
        let started = Instant::now();
        let new = with_prep(a, Some(old)).expect("the prep is added");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{}: {:?} for {} bytes",
            a.key,
            started.elapsed(),
            old.len()
        );
        assert!(new.value.len() <= old.len() + PREP_CONTAINER.len() + 1);
        assert!(new.value.ends_with(PREP_CONTAINER));
    }
}

// -------------------------------------------------------------------------------------------
// Through the pipeline
// -------------------------------------------------------------------------------------------

/// A pod that gets the prep: its cache volume is a claim the pod's own ephemeral volume makes.
fn prep_pod(annotations: Option<Value>) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "llm", "namespace": "team-a"},
        "spec": {
            "containers": [{"name": "main", "image": "vllm"}],
            "volumes": [{"name": "model-cache", "ephemeral": {"volumeClaimTemplate": {"spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}}}}]
        }
    });
    if let Some(a) = annotations {
        pod["metadata"]["annotations"] = a;
    }
    pod
}

/// `/mutate` on `object`, applied: the patch, the object after it, and the answer's changes.
fn mutate(object: &Value) -> (Vec<Value>, Value, testing::Answer) {
    let cfg = PolicyConfig::default();
    let index = CacheIndex::new();
    let review = testing::create_review("uid-1", object, "team-a");
    let answer = testing::review(Webhook::Mutate, &review, &testing::context(&cfg, &index));
    assert!(answer.allowed, "{}", answer.message);
    let patched = answer.patched(object);
    (answer.patch().to_vec(), patched, answer)
}

fn skip_ops(ops: &[Value]) -> Vec<&Value> {
    ops.iter()
        .filter(|op| op["path"].as_str().unwrap().starts_with("/metadata"))
        .collect()
}

#[test]
fn a_pod_without_annotations_gets_the_map_with_both() {
    let (ops, patched, _) = mutate(&prep_pod(None));
    assert_eq!(
        skip_ops(&ops),
        [
            &json!({"op": "add", "path": "/metadata/annotations", "value": {
            "azure.workload.identity/skip-containers": "model-cache-prep",
            "eks.amazonaws.com/skip-containers": "model-cache-prep"}})
        ]
    );
    assert_eq!(patched["spec"]["initContainers"][0]["name"], PREP_CONTAINER);
    // Reinvoked: nothing more.
    let (again, _, _) = mutate(&patched);
    assert_eq!(again, Vec::<Value>::new());
}

#[test]
fn existing_names_are_kept_and_the_keys_escaped() {
    let pod = prep_pod(Some(json!({
        "eks.amazonaws.com/skip-containers": "sidecar",
        "azure.workload.identity/skip-containers": "sidecar; model-cache-prep",
        "team": "a",
    })));
    let (ops, patched, answer) = mutate(&pod);
    assert_eq!(
        skip_ops(&ops),
        [
            &json!({"op": "add", "path": "/metadata/annotations/eks.amazonaws.com~1skip-containers",
                 "value": "sidecar,model-cache-prep"})
        ]
    );
    assert_eq!(patched["metadata"]["annotations"]["team"], "a");
    assert!(
        !answer
            .warnings
            .iter()
            .any(|w| w.contains("skip-containers")),
        "{:?}",
        answer.warnings
    );
    let (again, _, _) = mutate(&patched);
    assert_eq!(again, Vec::<Value>::new());
}

#[test]
fn each_change_is_described_for_reports() {
    let cfg = PolicyConfig::default();
    let index = CacheIndex::new();
    let ctx = testing::context(&cfg, &index);
    let review = testing::create_review("uid-1", &prep_pod(None), "team-a");
    let bytes = serde_json::to_vec(&review).unwrap();
    let request = crate::admission::Request::from_slice(&bytes).unwrap();
    let decision = crate::admission::decide(Webhook::Mutate, &request, &ctx);
    let described: Vec<(Rule, String)> = decision
        .changes
        .iter()
        .filter(|c| c.description().contains("skip-containers"))
        .map(|c| (c.rule, c.would()))
        .collect();
    assert_eq!(
        described,
        [
            (
                Rule::CachePrep,
                "would add model-cache-prep to azure.workload.identity/skip-containers".into()
            ),
            (
                Rule::CachePrep,
                "would add model-cache-prep to eks.amazonaws.com/skip-containers".into()
            ),
        ]
    );
    // No warning for an ordinary addition.
    assert!(
        !decision
            .warnings
            .iter()
            .any(|w| w.contains("skip-containers")),
        "{:?}",
        decision.warnings
    );
}

#[test]
fn a_rewritten_eks_value_is_warned_of() {
    let pod = prep_pod(Some(
        json!({"eks.amazonaws.com/skip-containers": "sidecar\nother"}),
    ));
    let (ops, _, answer) = mutate(&pod);
    assert!(
        skip_ops(&ops).contains(&&json!({"op": "add",
            "path": "/metadata/annotations/eks.amazonaws.com~1skip-containers",
            "value": "sidecar,model-cache-prep"})),
        "{ops:?}"
    );
    assert!(
        answer
            .warnings
            .iter()
            .any(|w| w.starts_with("eks.amazonaws.com/skip-containers rewritten")),
        "{:?}",
        answer.warnings
    );
}

#[test]
fn a_job_template_gets_them_too_and_its_metadata_when_missing() {
    let pod = prep_pod(None);
    let job = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"template": {"spec": pod["spec"].clone()}}
    });
    let (ops, patched, _) = mutate(&job);
    assert!(
        ops.contains(
            &json!({"op": "add", "path": "/spec/template/metadata", "value": {
            "annotations": {
                "azure.workload.identity/skip-containers": "model-cache-prep",
                "eks.amazonaws.com/skip-containers": "model-cache-prep"}}})
        ),
        "{ops:?}"
    );
    let (again, _, _) = mutate(&patched);
    assert_eq!(again, Vec::<Value>::new());
}

#[test]
fn a_pod_without_the_prep_gets_no_annotation() {
    let mut pod = prep_pod(None);
    pod["spec"]["volumes"] = json!([{"name": "model-cache", "emptyDir": {}}]);
    let (ops, _, _) = mutate(&pod);
    assert_eq!(skip_ops(&ops), Vec::<&Value>::new());
}
