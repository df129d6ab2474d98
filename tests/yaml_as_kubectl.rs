//! `review` reads YAML as kubectl reads it and `-o patched` writes back what it read
//! (docs/policy.md §8): octal file modes (`defaultMode: 0440` is 288), YAML 1.1 booleans (`yes`, `on`),
//! strings that only look like numbers or booleans, and JSON documents inside a YAML stream.
//!
//! Two oracles: the values the generator meant (always), and the pinned kubectl itself
//! (`kubectl label --local -o json`, which reads files exactly as `kubectl apply` does, offline),
//! found in `$MODELGATE_KUBECTL`, `$MODELGATE_TOOLS_DIR/bin` or `.tools/bin`. Without kubectl the
//! kubectl comparisons are skipped, unless `MODELGATE_REQUIRE_TOOLS=1` (scripts/test.sh sets it
//! once the tools are installed), where its absence fails.

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use modelgate::cli::{Cli, Command as Sub};
use modelgate::documents::read_documents;
use proptest::prelude::*;
use serde_json::{Value, json};

fn kubectl() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("MODELGATE_KUBECTL").map(PathBuf::from),
        std::env::var_os("MODELGATE_TOOLS_DIR").map(|d| Path::new(&d).join("bin/kubectl")),
        Some(Path::new(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/kubectl")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("MODELGATE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "kubectl is required (MODELGATE_REQUIRE_TOOLS=1) but was not found; run scripts/install-tools.sh"
        );
        println!("kubectl not found: the kubectl comparisons are skipped");
    }
    found
}

/// What kubectl reads from `file`: one JSON object per document (List items included), with the
/// label `kubectl label` had to add taken away again.
fn kubectl_reads(kubectl: &Path, file: &Path) -> Vec<Value> {
    let out = Command::new(kubectl)
        .args(["label", "--local", "-o", "json", "modelgate-test=x", "-f"])
        .arg(file)
        .env("KUBECONFIG", "/dev/null")
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl failed on {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .map(|v| {
            let mut v = v.expect("kubectl prints JSON");
            let labels = v["metadata"]["labels"].as_object_mut().unwrap();
            labels.remove("modelgate-test");
            if labels.is_empty() {
                v["metadata"].as_object_mut().unwrap().remove("labels");
            }
            v
        })
        .collect()
}

fn we_read(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file).unwrap();
    read_documents("input", &text)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(|d| d.value)
        .collect()
}

/// `modelgate review -o <output> <file>` in this process.
fn review(output: &str, file: &Path) -> String {
    let cli =
        Cli::try_parse_from(["modelgate", "review", "-o", output, file.to_str().unwrap()]).unwrap();
    let Sub::Review(args) = cli.command else {
        unreachable!()
    };
    let mut out = Vec::new();
    modelgate::cli::review::execute(args, &mut out).expect("review runs");
    String::from_utf8(out).unwrap()
}

/// Spellings that go-yaml v2 (sigs.k8s.io/yaml) reads as `true` or `false`.
const TRUE: [&str; 11] = [
    "y", "Y", "yes", "Yes", "YES", "on", "On", "ON", "true", "True", "TRUE",
];
const FALSE: [&str; 11] = [
    "n", "N", "no", "No", "NO", "off", "Off", "OFF", "false", "False", "FALSE",
];
/// Strings that a YAML 1.1 reader would take for something else when written plain.
const LOOKALIKES: [&str; 22] = [
    "0440",
    "0o17",
    "0x1F",
    "0b101",
    "1_000",
    "1e3",
    ".5",
    "08",
    "+1",
    "-0",
    "yes",
    "on",
    "y",
    "N",
    "~",
    "null",
    "",
    "2001-12-14",
    ".inf",
    "-.Inf",
    ".NaN",
    "1:20",
];

#[derive(Clone, Debug)]
enum ModeSpelling {
    /// `0440`: YAML 1.1 octal.
    Octal,
    /// `0o440`.
    OctalO,
    Decimal,
    Hex,
}

fn spell(mode: u32, how: &ModeSpelling) -> String {
    match how {
        ModeSpelling::Octal => format!("0{mode:o}"),
        ModeSpelling::OctalO => format!("0o{mode:o}"),
        ModeSpelling::Decimal => mode.to_string(),
        ModeSpelling::Hex => format!("0x{mode:x}"),
    }
}

#[derive(Clone, Debug)]
struct Case {
    modes: Vec<(u32, ModeSpelling)>,
    read_only: Vec<(bool, usize)>,
    annotations: Vec<(usize, bool)>,
    json_second_document: bool,
}

fn case() -> impl Strategy<Value = Case> {
    let spelling = prop_oneof![
        3 => Just(ModeSpelling::Octal),
        1 => Just(ModeSpelling::OctalO),
        1 => Just(ModeSpelling::Decimal),
        1 => Just(ModeSpelling::Hex),
    ];
    (
        prop::collection::vec((0u32..=0o777, spelling), 1..4),
        prop::collection::vec((any::<bool>(), 0usize..11), 1..4),
        prop::collection::vec((0usize..LOOKALIKES.len(), any::<bool>()), 0..5),
        any::<bool>(),
    )
        .prop_map(
            |(modes, read_only, annotations, json_second_document)| Case {
                modes,
                read_only,
                annotations,
                json_second_document,
            },
        )
}

/// The case as a YAML stream, and the objects it means.
fn render(case: &Case) -> (String, Vec<Value>) {
    let mut yaml = String::from("apiVersion: v1\nkind: Pod\nmetadata:\n  name: modes\n");
    let mut annotations = serde_json::Map::new();
    if !case.annotations.is_empty() {
        yaml.push_str("  annotations:\n");
        for (i, (which, double)) in case.annotations.iter().enumerate() {
            let text = LOOKALIKES[*which];
            let quoted = if *double {
                format!("\"{text}\"")
            } else {
                format!("'{text}'")
            };
            yaml.push_str(&format!("    example.com/a{i}: {quoted}\n"));
            annotations.insert(format!("example.com/a{i}"), json!(text));
        }
    }
    yaml.push_str("spec:\n  containers:\n  - name: app\n    image: nginx\n    volumeMounts:\n");
    let mut mounts = Vec::new();
    for (i, (value, spelling)) in case.read_only.iter().enumerate() {
        let word = if *value {
            TRUE[*spelling]
        } else {
            FALSE[*spelling]
        };
        yaml.push_str(&format!(
            "    - name: v{i}\n      mountPath: /m{i}\n      readOnly: {word}\n"
        ));
        mounts.push(
            json!({"name": format!("v{i}"), "mountPath": format!("/m{i}"), "readOnly": value}),
        );
    }
    yaml.push_str("  volumes:\n");
    let mut volumes = Vec::new();
    for i in 0..case.read_only.len() {
        let (mode, spelling) = &case.modes[i % case.modes.len()];
        let (item_mode, item_spelling) = &case.modes[(i + 1) % case.modes.len()];
        yaml.push_str(&format!(
            "  - name: v{i}\n    secret:\n      secretName: s{i}\n      defaultMode: {}\n      items:\n      - key: k\n        path: p\n        mode: {}\n",
            spell(*mode, spelling),
            spell(*item_mode, item_spelling)
        ));
        volumes.push(json!({"name": format!("v{i}"), "secret": {
            "secretName": format!("s{i}"), "defaultMode": mode,
            "items": [{"key": "k", "path": "p", "mode": item_mode}]}}));
    }
    let mut metadata = json!({"name": "modes"});
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    let first = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
        "spec": {"containers": [{"name": "app", "image": "nginx", "volumeMounts": mounts}], "volumes": volumes}});
    let mut objects = vec![first];
    if case.json_second_document {
        // JSON inside the YAML stream, as `kubectl get -o json` pieces are often pasted.
        let second = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"},
            "data": {"mode": "0440", "flag": "yes"}});
        yaml.push_str("---\n");
        yaml.push_str(&serde_json::to_string_pretty(&second).unwrap());
        yaml.push('\n');
        objects.push(second);
    }
    (yaml, objects)
}

/// The object without what the policy adds (the pod's security context), to compare with the
/// input as read.
fn without_policy_fields(mut v: Value) -> Value {
    if let Some(spec) = v.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("securityContext");
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn modes_booleans_and_lookalike_strings_round_trip_through_patched(case in case()) {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.yaml");
        let (yaml, meant) = render(&case);
        std::fs::write(&input, &yaml).unwrap();

        // 1. Read as kubectl reads: octal modes are integers, YAML 1.1 words are booleans,
        //    quoted look-alikes stay strings, the JSON document is part of the stream.
        let read = we_read(&input);
        prop_assert_eq!(&read, &meant, "{}", yaml);

        // 2. `-o patched` writes YAML that reads back as exactly what review computed
        //    (`-o patched-json`), and that is the input plus the policy's fields.
        let patched_yaml = review("patched", &input);
        let output = dir.path().join("out.yaml");
        std::fs::write(&output, &patched_yaml).unwrap();
        let reread = we_read(&output);
        let computed: Vec<Value> = review("patched-json", &input)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        prop_assert_eq!(&reread, &computed, "{}", patched_yaml);
        prop_assert_eq!(reread.len(), meant.len());
        for (out, want) in reread.iter().zip(&meant) {
            prop_assert_eq!(without_policy_fields(out.clone()), want.clone());
        }
        prop_assert_eq!(&reread[0]["spec"]["securityContext"]["runAsNonRoot"], &json!(true));

        // 3. kubectl reads the input and our output as we do.
        if let Some(kubectl) = kubectl() {
            prop_assert_eq!(&kubectl_reads(&kubectl, &input), &meant, "{}", yaml);
            prop_assert_eq!(&kubectl_reads(&kubectl, &output), &reread, "{}", patched_yaml);
        }
    }
}

/// Scalars of every kind go-yaml v2 resolves, side by side with kubectl.
const SCALARS: &str = r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: scalars
  annotations:
    quoted: "0440"
    single: 'on'
    block: |
      0440
spec:
  octal: 0440
  octalNegative: -0755
  octalO: 0o17
  hex: 0x1F
  hexNegative: -0x10
  binary: 0b101
  underscores: 1_000
  eight: 08
  nineAndAHalf: 09.5
  float: 1.5
  integralFloat: 2.0
  trailingDot: 3.
  exponent: 1e3
  leadingDot: .5
  negativeLeadingDot: -.5
  plus: +12
  int64: 9223372036854775807
  big: 1e21
  bools: [y, Y, yes, Yes, YES, on, On, ON, true, True, TRUE, n, N, no, No, NO, off, Off, OFF, false, False, FALSE]
  nulls: [~, null, Null, NULL, ]
  strings: [yess, nULL, 1.2.3, 0x, +, 0440abc, 2001-12-14, 2001-12-14T21:59:43.10Z, "12", !!str 34]
  tagged: [!!int "12", !!float 1]
  keys: {on: a, 1: b, 0x10: c, 1.5: d, 1000000.0: e, "n": g}
  merged:
    <<: {inherited: 1}
    own: 2
  duplicated: first
  duplicated: second
---
{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "json-in-yaml"},
 "spec": {"a": 1.0, "b": [1, 2.5e3], "c": "0440"}}
"#;

#[test]
fn scalars_read_as_kubectl_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scalars.yaml");
    std::fs::write(&file, SCALARS).unwrap();
    let ours = we_read(&file);
    let spec = &ours[0]["spec"];
    assert_eq!(spec["octal"], 288);
    assert_eq!(spec["octalNegative"], -493);
    assert_eq!(spec["integralFloat"], json!(2));
    assert_eq!(spec["duplicated"], "second");
    assert_eq!(spec["big"], json!(1e21));
    assert_eq!(
        spec["keys"],
        json!({"true": "a", "1": "b", "16": "c", "1.5": "d", "1e+06": "e", "n": "g"})
    );
    assert_eq!(
        ours[1]["spec"],
        json!({"a": 1, "b": [1, 2500], "c": "0440"})
    );
    let Some(kubectl) = kubectl() else { return };
    let theirs = kubectl_reads(&kubectl, &file);
    assert_eq!(ours, theirs);
}

/// Where serde-saphyr resolves a plain scalar differently from go-yaml v2
/// (docs/decisions/0026-reading-yaml-as-kubectl-does.md):
/// spellings no generator or manifest writer produces. Kept as a test so that a change on
/// either side is noticed.
#[test]
fn known_differences_from_kubectl_are_the_documented_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("odd.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: odd}\nspec: {mixedCase: yEs, upperHex: 0X1F, doubleUnderscore: 1__0, trailingUnderscore: 1_}\n",
    )
    .unwrap();
    let ours = &we_read(&file)[0]["spec"];
    assert_eq!(
        ours,
        &json!({"mixedCase": true, "upperHex": "0X1F", "doubleUnderscore": "1__0", "trailingUnderscore": "1_"})
    );
    let Some(kubectl) = kubectl() else { return };
    let theirs = &kubectl_reads(&kubectl, &file)[0]["spec"];
    assert_eq!(
        theirs,
        &json!({"mixedCase": "yEs", "upperHex": 31, "doubleUnderscore": 10, "trailingUnderscore": 1})
    );
}
