use serde_json::json;

use super::*;

fn pod(value: serde_json::Value) -> String {
    value.to_string()
}

fn failure_of(text: &str) -> DecodeFailure {
    decode_pod(text).expect_err("the pod must not decode")
}

#[test]
fn reads_every_field_a_rule_reads() {
    let text = pod(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "llama-",
            "namespace": "team-a",
            "labels": {"app": "llama"},
            "annotations": {"modelgate.io/model-uri": "hf://org/m"},
            "ownerReferences": [{"kind": "ReplicaSet", "name": "x"}]
        },
        "spec": {
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3, "runAsNonRoot": true, "fsGroup": 102, "seLinuxOptions": {}},
            "os": {"name": "linux"},
            "nodeSelector": {"node-type": "gpu"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}
            ]}}, "podAntiAffinity": {}},
            "volumes": [
                {"name": "model-cache", "persistentVolumeClaim": {"claimName": "c", "readOnly": false}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "api", "projected": {"sources": []}}
            ],
            "initContainers": [{"name": "model-cache-prep", "image": "x", "securityContext": {"runAsUser": 0}}],
            "containers": [{
                "name": "vllm",
                "image": "vllm",
                "securityContext": {"runAsNonRoot": false, "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "model-cache", "mountPath": "/models", "subPath": "s", "readOnly": true, "mountPropagation": "None"}]
            }],
            "ephemeralContainers": [{"name": "debug"}]
        },
        "status": {"phase": "Pending"}
    }));
    let p = decode_pod(&text).unwrap();
    assert_eq!(p.kind.as_deref(), Some("Pod"));
    let meta = p.metadata.as_ref().unwrap();
    assert_eq!(meta.name, None);
    assert_eq!(meta.generate_name.as_deref(), Some("llama-"));
    assert_eq!(meta.namespace.as_deref(), Some("team-a"));
    assert_eq!(meta.labels.as_ref().unwrap().get("app"), Some("llama"));
    assert_eq!(
        meta.annotations
            .as_ref()
            .unwrap()
            .get("modelgate.io/model-uri"),
        Some("hf://org/m")
    );
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(
        spec.security_context,
        Some(PodSecurityContextView {
            run_as_user: Some(1000),
            run_as_group: Some(3),
            run_as_non_root: Some(true),
            fs_group: Some(102),
        })
    );
    assert_eq!(spec.os.as_ref().unwrap().name.as_deref(), Some("linux"));
    assert_eq!(
        spec.node_selector.as_ref().unwrap().get("node-type"),
        Some("gpu")
    );
    let terms = spec
        .required_node_selector()
        .unwrap()
        .node_selector_terms
        .as_ref()
        .unwrap();
    let expr = &terms[0].match_expressions.as_ref().unwrap()[0];
    assert_eq!(expr.key.as_deref(), Some("kubernetes.io/os"));
    assert_eq!(expr.operator.as_deref(), Some("In"));
    assert_eq!(expr.values.as_ref().unwrap()[0], "linux");
    assert_eq!(terms[0].match_fields, None);
    let volumes = spec.volumes();
    assert_eq!(volumes.len(), 3);
    assert_eq!(volumes[0].name(), "model-cache");
    assert_eq!(volumes[0].sources, [Str("persistentVolumeClaim".into())]);
    let claim = volumes[0].persistent_volume_claim.as_ref().unwrap();
    assert_eq!(
        (claim.claim_name.as_deref(), claim.read_only),
        (Some("c"), Some(false))
    );
    assert!(volumes[1].has_source("emptyDir"));
    assert!(volumes[2].has_source("projected"));
    let init = &spec.init_containers()[0];
    assert_eq!(init.container.name(), "model-cache-prep");
    assert_eq!(
        init.container
            .security_context
            .as_ref()
            .unwrap()
            .run_as_user,
        Some(0)
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(init.raw.get()).unwrap(),
        json!({"name": "model-cache-prep", "image": "x", "securityContext": {"runAsUser": 0}})
    );
    let c = &spec.containers()[0];
    assert_eq!(c.name(), "vllm");
    assert_eq!(
        c.security_context.as_ref().unwrap().run_as_non_root,
        Some(false)
    );
    let mount = &c.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(mount.name.as_deref(), Some("model-cache"));
    assert_eq!(mount.mount_path.as_deref(), Some("/models"));
    assert_eq!(mount.sub_path.as_deref(), Some("s"));
    assert_eq!(mount.read_only, Some(true));
    assert_eq!(mount.mount_propagation, Some(IgnoredAnyPresent));
    assert_eq!(mount.sub_path_expr, None);
    assert_eq!(spec.ephemeral_containers()[0].name(), "debug");
}

#[test]
fn strings_borrow_from_the_text_unless_escaped() {
    let text = r#"{"metadata": {"name": "plain", "namespace": "a\"b\u00e9\n", "labels": {"k\/1": "v\t"}}}"#;
    let p = decode_pod(text).unwrap();
    let meta = p.metadata.unwrap();
    assert!(matches!(
        meta.name.as_ref().unwrap().0,
        Cow::Borrowed("plain")
    ));
    let ns = meta.namespace.unwrap();
    assert_eq!(&*ns, "a\"bé\n");
    assert!(matches!(ns.0, Cow::Owned(_)));
    assert_eq!(meta.labels.unwrap().get("k/1"), Some("v\t"));
}

#[test]
fn escaped_keys_are_the_keys_they_spell() {
    let text = r#"{"spec": {"securityContext": {"run\u0041sUser": 7}, "contain\u0065rs": [{"n\u0061me": "c"}]}}"#;
    let p = decode_pod(text).unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.security_context.as_ref().unwrap().run_as_user, Some(7));
    assert_eq!(spec.containers()[0].name(), "c");
}

#[test]
fn a_key_given_twice_keeps_its_last_value() {
    let text = r#"{
        "metadata": {"annotations": {"b": "1", "a": "x", "b": "2"}, "name": "first", "name": "second"},
        "spec": {
            "securityContext": {"runAsUser": 0, "runAsUser": 1000},
            "volumes": [
                {"name": "v", "emptyDir": {}, "emptyDir": null, "nfs": {"server": "s"}},
                {"name": "w", "persistentVolumeClaim": {"claimName": "c"}, "persistentVolumeClaim": null}
            ]
        }
    }"#;
    let p = decode_pod(text).unwrap();
    let meta = p.metadata.unwrap();
    assert_eq!(meta.name.as_deref(), Some("second"));
    let annotations = meta.annotations.unwrap();
    // As serde_json's maps and k8s-openapi's BTreeMap: sorted, the last value wins.
    assert_eq!(annotations, StrMap::from_pairs([("a", "x"), ("b", "2")]));
    assert_eq!(annotations.pairs()[1].1, "2");
    let spec = p.spec.unwrap();
    assert_eq!(
        spec.security_context.as_ref().unwrap().run_as_user,
        Some(1000)
    );
    assert_eq!(spec.volumes()[0].sources, [Str("nfs".into())]);
    assert!(spec.volumes()[1].sources.is_empty());
    assert_eq!(spec.volumes()[1].persistent_volume_claim, None);
    // The same as serde_json's own maps.
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(value["metadata"]["annotations"]["b"], "2");
}

/// A volume of many source keys (the API server admits one, but a mutating webhook sees the
/// object before that check): every key given, each once with its last value, in the order of
/// its last occurrence.
#[test]
fn a_volume_of_many_keys_keeps_each_key_s_last_value() {
    let n = 90_000;
    let mut volume = String::from(r#"{"name":"v""#);
    for i in 0..n {
        volume.push_str(&format!(r#","s{i}":{{}}"#));
    }
    // Given again: every third key removed by a `null`, every fifth given again (moved last).
    for i in (0..n).step_by(3) {
        volume.push_str(&format!(r#","s{i}":null"#));
    }
    for i in (0..n).step_by(5) {
        volume.push_str(&format!(r#","s{i}":{{"again":true}}"#));
    }
    volume.push_str(r#","persistentVolumeClaim":{"claimName":"c"},"persistentVolumeClaim":null}"#);
    let text = format!(r#"{{"spec":{{"volumes":[{volume}]}}}}"#);
    let p = decode_pod(&text).unwrap();
    let spec = p.spec.unwrap();
    let v = &spec.volumes()[0];
    assert_eq!(v.name(), "v");
    assert_eq!(v.persistent_volume_claim, None);
    let expected: Vec<String> = (0..n)
        .filter(|i| i % 3 != 0 && i % 5 != 0)
        .chain((0..n).step_by(5))
        .map(|i| format!("s{i}"))
        .collect();
    let sources: Vec<&str> = v.sources.iter().map(|s| &**s).collect();
    assert_eq!(sources, expected);
    assert!(v.has_source("s1") && v.has_source("s5") && !v.has_source("s3"));
}

/// The one source of a volume, and a source given and removed, need no look-up of repeats.
#[test]
fn a_volume_of_one_source_or_none_reads_it() {
    let one = decode_pod(r#"{"spec":{"volumes":[{"name":"v","nfs":{}}]}}"#).unwrap();
    assert_eq!(one.spec.unwrap().volumes()[0].sources, [Str("nfs".into())]);
    let gone = decode_pod(r#"{"spec":{"volumes":[{"name":"v","nfs":null}]}}"#).unwrap();
    assert!(gone.spec.unwrap().volumes()[0].sources.is_empty());
    let twice =
        decode_pod(r#"{"spec":{"volumes":[{"nfs":null,"emptyDir":{},"nfs":{}}]}}"#).unwrap();
    assert_eq!(
        twice.spec.unwrap().volumes()[0].sources,
        [Str("emptyDir".into()), Str("nfs".into())]
    );
}

/// An init container's raw text is exactly the text received (spacing included), and of two
/// lists given, the last is read.
#[test]
fn an_init_container_s_raw_text_is_the_text_received() {
    let text = r#"{"kind":"Job","spec":{"template":{"spec":{"initContainers":[ {"name":"a", "image" : "x"} ,{"name":"b"}],"containers":[{"name":"x"}],"containers":[{"name":"y"}]}}}}"#;
    let job = decode_job(text).unwrap();
    let spec = job.spec.unwrap().template.unwrap().spec.unwrap();
    assert_eq!(spec.containers()[0].name(), "y");
    assert_eq!(
        spec.init_containers()[0].raw.get(),
        r#"{"name":"a", "image" : "x"}"#
    );
    assert_eq!(spec.init_containers()[1].container.name(), "b");
}

#[test]
fn null_is_absent_and_a_missing_name_reads_empty() {
    let text = r#"{"metadata": null, "spec": {"securityContext": {"runAsUser": null},
        "containers": [{"name": null, "securityContext": null, "volumeMounts": null}, {}],
        "initContainers": null, "volumes": [{"name": "v", "emptyDir": null}]}}"#;
    let p = decode_pod(text).unwrap();
    assert!(p.metadata.is_none());
    let spec = p.spec.unwrap();
    assert_eq!(spec.security_context.as_ref().unwrap().run_as_user, None);
    assert_eq!(spec.containers()[0].name(), "");
    assert_eq!(spec.containers()[0].security_context, None);
    assert_eq!(spec.containers()[1].name(), "");
    assert!(spec.init_containers().is_empty());
    assert!(spec.volumes()[0].sources.is_empty());
}

#[test]
fn fields_no_rule_reads_are_skipped_unchecked() {
    let text = pod(json!({
        "metadata": {"creationTimestamp": 7, "ownerReferences": "nonsense", "finalizers": {"a": 1}},
        "spec": {
            "containers": [{"name": "c", "imagePullPolicy": 5, "ports": "x", "resources": [1, 2],
                            "securityContext": {"capabilities": "all", "allowPrivilegeEscalation": "yes"}}],
            "volumes": [{"name": "v", "hostPath": {"type": 3}}],
            "dnsPolicy": ["x"],
            "future": {"deep": [{"x": null}]}
        },
        "status": 5
    }));
    let p = decode_pod(&text).unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.containers()[0].name(), "c");
    assert!(spec.volumes()[0].has_source("hostPath"));
}

#[test]
fn the_whole_text_must_still_be_well_formed_json() {
    for bad in [
        r#"{"spec": {"future": [1, 2,]}}"#,
        r#"{"spec": {"future": "\q"}}"#,
        "{\"spec\": {\"future\": \"a\u{1}b\"}}",
        r#"{"spec": {"future": tru}}"#,
        r#"{"spec": {"future": 01}}"#,
        r#"{"spec": {"initContainers": [{"name": "p", "x": [}]}}"#,
        r#"{"spec": {}} trailing"#,
        r#"{"spec": {}"#,
    ] {
        let failure = failure_of(bad);
        assert!(!failure.message.is_empty(), "{bad}");
    }
}

/// The message a typed k8s-openapi decode gives, for the same text (path and message).
fn typed_failure(text: &str) -> DecodeFailure {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct TypedPod {
        kind: Option<String>,
        metadata: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
        spec: Option<k8s_openapi::api::core::v1::PodSpec>,
    }
    let de = &mut serde_json::Deserializer::from_str(text);
    let e = match serde_path_to_error::deserialize::<_, TypedPod>(de) {
        Err(e) => e,
        Ok(_) => panic!("the typed decode accepts {text}"),
    };
    let inner = e.inner();
    let message = inner.to_string();
    let position = format!(" at line {} column {}", inner.line(), inner.column());
    DecodeFailure {
        path: e.path().to_string(),
        message: message.strip_suffix(&position).unwrap().to_string(),
        too_large: false,
    }
}

#[test]
fn a_read_field_of_the_wrong_type_is_named_as_the_typed_decode_names_it() {
    let cases = [
        (
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": "0"}}]}}),
            "spec.containers[1].securityContext.runAsUser",
            r#"invalid type: string "0", expected i64"#,
        ),
        (
            json!({"spec": {"securityContext": {"runAsUser": 1000.5}}}),
            "spec.securityContext.runAsUser",
            "invalid type: floating point `1000.5`, expected i64",
        ),
        (
            json!({"spec": {"securityContext": {"fsGroup": 9_223_372_036_854_775_808u64}}}),
            "spec.securityContext.fsGroup",
            "invalid value: integer `9223372036854775808`, expected i64",
        ),
        (
            json!({"spec": {"initContainers": [{"name": "p", "securityContext": {"runAsGroup": true}}]}}),
            "spec.initContainers[0].securityContext.runAsGroup",
            "invalid type: boolean `true`, expected i64",
        ),
        (
            json!({"spec": {"ephemeralContainers": [{"name": "d", "securityContext": {"runAsNonRoot": "true"}}]}}),
            "spec.ephemeralContainers[0].securityContext.runAsNonRoot",
            r#"invalid type: string "true", expected a boolean"#,
        ),
        (
            json!({"spec": {"containers": {"name": "c"}}}),
            "spec.containers",
            "invalid type: map, expected a sequence",
        ),
        (
            json!({"spec": {"containers": [{"name": 5}]}}),
            "spec.containers[0].name",
            "invalid type: integer `5`, expected a string",
        ),
        (
            json!({"metadata": {"annotations": {"a": 1}}}),
            "metadata.annotations.a",
            "invalid type: integer `1`, expected a string",
        ),
        (
            json!({"metadata": {"labels": ["a"]}}),
            "metadata.labels",
            "invalid type: sequence, expected a map",
        ),
        (
            json!({"spec": {"containers": [{"name": "c", "volumeMounts": [{"name": "m", "mountPath": ["/x"]}]}]}}),
            "spec.containers[0].volumeMounts[0].mountPath",
            "invalid type: sequence, expected a string",
        ),
        (
            json!({"spec": {"nodeSelector": {"a": null}}}),
            "spec.nodeSelector.a",
            "invalid type: null, expected a string",
        ),
        (
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": "x"}]}]}}}}}),
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values",
            r#"invalid type: string "x", expected a sequence"#,
        ),
        (
            json!({"spec": {"os": {"name": 1}}}),
            "spec.os.name",
            "invalid type: integer `1`, expected a string",
        ),
        (
            json!({"spec": {"volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": 3}}]}}),
            "spec.volumes[0].persistentVolumeClaim.claimName",
            "invalid type: integer `3`, expected a string",
        ),
        (
            json!({"spec": {"securityContext": "root"}}),
            "spec.securityContext",
            r#"invalid type: string "root", expected PodSecurityContext"#,
        ),
        (
            json!({"spec": {"containers": [["c"]]}}),
            "spec.containers[0]",
            "invalid type: sequence, expected Container",
        ),
    ];
    for (object, path, message) in cases {
        let text = object.to_string();
        let failure = failure_of(&text);
        assert_eq!(failure.path, path, "{text}");
        assert_eq!(failure.message, message, "{text}");
        assert_eq!(failure, typed_failure(&text), "{text}");
    }
}

#[test]
fn a_root_that_is_not_an_object_is_refused() {
    for (text, message) in [
        ("[]", "invalid type: sequence, expected Pod"),
        (r#""pod""#, r#"invalid type: string "pod", expected Pod"#),
        ("1", "invalid type: integer `1`, expected Pod"),
        ("null", "invalid type: null, expected Pod"),
    ] {
        let failure = failure_of(text);
        assert_eq!(
            (failure.path.as_str(), failure.message.as_str()),
            (".", message)
        );
    }
    let failure = decode_job("[]").unwrap_err();
    assert_eq!(failure.message, "invalid type: sequence, expected Job");
}

#[test]
fn deep_nesting_costs_no_stack() {
    let depth = 100_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    // In a field no rule reads: skipped with serde_json's heap stack, accepted.
    let unread = format!(r#"{{"spec": {{"future": {nested}, "containers": [{{"name": "c"}}]}}}}"#);
    assert_eq!(
        decode_pod(&unread).unwrap().spec.unwrap().containers()[0].name(),
        "c"
    );
    // Inside an init container, whose raw text is kept: the same.
    let init = format!(r#"{{"spec": {{"initContainers": [{{"name": "p", "x": {nested}}}]}}}}"#);
    assert_eq!(
        decode_pod(&init).unwrap().spec.unwrap().init_containers()[0]
            .container
            .name(),
        "p"
    );
    // Unclosed: an error, not a crash.
    let unclosed = format!(r#"{{"spec": {{"future": {}"#, "[".repeat(depth));
    assert!(
        failure_of(&unclosed)
            .message
            .starts_with("EOF while parsing")
    );
    let unclosed_init = format!(
        r#"{{"spec": {{"initContainers": [{}"#,
        "{\"a\":".repeat(depth)
    );
    assert!(
        failure_of(&unclosed_init)
            .message
            .starts_with("EOF while parsing")
    );
    // Where a value is decoded, nesting deeper than the views' own shape is a type error.
    let in_read = format!(r#"{{"metadata": {{"labels": {{"a": {nested}}}}}}}"#);
    assert_eq!(failure_of(&in_read).path, "metadata.labels.a");
}

#[test]
fn a_job_is_read_through_its_pod_template() {
    let text = pod(json!({
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "backoffLimit": "not read",
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {"initContainers": [{"name": "i"}], "containers": [{"name": "c"}]}
            }
        }
    }));
    let j = decode_job(&text).unwrap();
    assert_eq!(j.metadata.unwrap().name.as_deref(), Some("train"));
    let template = j.spec.unwrap().template.unwrap();
    assert_eq!(
        template.metadata.unwrap().labels.unwrap().get("a"),
        Some("b")
    );
    let spec = template.spec.unwrap();
    assert_eq!(spec.init_containers()[0].container.name(), "i");
    assert_eq!(spec.containers()[0].name(), "c");
    let bad = r#"{"spec": {"template": {"spec": {"initContainers": [{"securityContext": {"runAsUser": "0"}}]}}}}"#;
    let failure = decode_job(bad).unwrap_err();
    assert_eq!(
        failure.path,
        "spec.template.spec.initContainers[0].securityContext.runAsUser"
    );
}

#[test]
fn the_reference_reviews_decode() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/reviews");
    for name in [
        "one-container-pod",
        "llm-serving-pod",
        "twenty-container-pod",
    ] {
        let body = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
        let review: serde_json::Value = serde_json::from_str(&body).unwrap();
        let text = review["request"]["object"].to_string();
        let p = decode_pod(&text).unwrap();
        let typed: k8s_openapi::api::core::v1::Pod = serde_json::from_str(&text).unwrap();
        let spec = p.spec.unwrap();
        let typed_spec = typed.spec.unwrap();
        assert_eq!(
            spec.containers().len(),
            typed_spec.containers.len(),
            "{name}"
        );
        for (c, t) in spec.containers().iter().zip(&typed_spec.containers) {
            assert_eq!(c.name(), t.name);
        }
        assert_eq!(
            spec.volumes().iter().map(|v| v.name()).collect::<Vec<_>>(),
            typed_spec
                .volumes
                .iter()
                .flatten()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
        );
    }
}
