//! One test per rule of docs/policy.md §5 that the index decides: matching, precedence, node-group
//! choice, each hit check and each miss reason.

use std::cell::Cell;

use super::*;

thread_local! {
    /// How many model URI prefixes [`Scope::find`] has hashed on this thread.
    pub(super) static URI_PROBES: Cell<usize> = const { Cell::new(0) };
}

/// The prefixes `f` makes the index hash.
fn probes(f: impl FnOnce()) -> usize {
    let before = URI_PROBES.with(Cell::get);
    f();
    URI_PROBES.with(Cell::get) - before
}

fn term(key: &str, op: &str, values: &[&str]) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }]),
        match_fields: None,
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ns(n: &str) -> CacheScope {
    CacheScope::Namespace(n.into())
}

const BOUND: PvcState = PvcState::provisioned(PvcPhase::Bound);

/// Two node groups (gpu: node-type=gpu, cpu: node-type=cpu), nodes g1 (zone a), g2 (zone b),
/// c1, and the PVCs KServe would make for cache `llama` in team-a.
fn cluster() -> CacheIndex {
    let mut idx = CacheIndex::new();
    idx.upsert_node_group("gpu", Some(vec![term("node-type", "In", &["gpu"])]));
    idx.upsert_node_group("cpu", Some(vec![term("node-type", "In", &["cpu"])]));
    idx.upsert_node(
        "g1",
        labels(&[
            ("kubernetes.io/hostname", "g1"),
            ("node-type", "gpu"),
            ("zone", "a"),
        ]),
    );
    idx.upsert_node(
        "g2",
        labels(&[
            ("kubernetes.io/hostname", "g2"),
            ("node-type", "gpu"),
            ("zone", "b"),
        ]),
    );
    idx.upsert_node(
        "c1",
        labels(&[
            ("kubernetes.io/hostname", "c1"),
            ("node-type", "cpu"),
            ("zone", "a"),
        ]),
    );
    idx.upsert_pvc("team-a", "llama-gpu", BOUND);
    idx.upsert_pvc("team-a", "llama-cpu", BOUND);
    idx
}

fn req<'a>(namespace: &'a str, uri: &'a str) -> LookupRequest<'a> {
    LookupRequest {
        namespace,
        model_uri: uri,
        node_group: None,
        node_selector: None,
        layout: CacheLayout::StorageKey,
    }
}

fn hit(idx: &CacheIndex, r: &LookupRequest) -> Hit {
    match idx.lookup(r) {
        Lookup::Hit(h) => h,
        Lookup::Miss(m) => panic!("expected a hit, got {m:?}"),
    }
}

fn miss(idx: &CacheIndex, r: &LookupRequest) -> Miss {
    match idx.lookup(r) {
        Lookup::Miss(m) => m,
        Lookup::Hit(h) => panic!("expected a miss, got {h:?}"),
    }
}

fn llama(groups: &[&str]) -> CacheEntry {
    CacheEntry::new(CacheScope::Cluster, "llama", "hf://org/llama", groups)
}

#[test]
fn prefixes_stop_at_slash_boundaries() {
    let p: Vec<_> = prefixes_longest_first("gs://b/model/v1").collect();
    assert_eq!(
        p,
        ["gs://b/model/v1", "gs://b/model", "gs://b", "gs:/", "gs:"]
    );
}

/// A URI of slashes used to cost a hash of every `/`-prefix (quadratic in its length): only the
/// prefixes as long as some cache URI of the scope are hashed now.
#[test]
fn only_prefixes_as_long_as_a_cache_uri_are_hashed() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1"]));
    idx.upsert_cache(CacheEntry::new(ns("team-a"), "short", "s3://b", &["gpu"]));
    let scope = &idx.cluster;
    let slashes = "/".repeat(1 << 20);
    // One integer probe per slash; only the prefix as long as `hf://org/llama` (14) is hashed.
    assert_eq!(probes(|| assert!(scope.find(&slashes).is_none())), 1);
    let long = format!("hf://org/llama{slashes}x");
    assert_eq!(probes(|| assert!(scope.find(&long).is_some())), 1);
    // A prefix of a candidate length that is not a cache URI is hashed, and only it.
    let other = format!("hf://org/other{slashes}x");
    assert_eq!(probes(|| assert!(scope.find(&other).is_none())), 1);
    // Through the lookup, both scopes, within the length limit (a normal URI: an empty
    // segment is a miss before any lookup).
    let uri = format!(
        "hf://org/llama{}",
        "/a".repeat((MAX_MODEL_URI_LEN - 14) / 2)
    );
    assert_eq!(
        probes(|| assert!(idx.lookup(&req("team-a", &uri)).hit().is_some())),
        1
    );
}

#[test]
fn the_candidate_lengths_follow_the_caches() {
    let mut idx = CacheIndex::new();
    let empty = idx.clone();
    idx.upsert_cache(llama(&["gpu"]));
    idx.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "twin",
        "hf://org/llama/",
        &["gpu"],
    ));
    idx.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "m",
        "hf://org/m",
        &["gpu"],
    ));
    assert_eq!(idx.cluster.uri_lengths.get(&14), Some(&1));
    assert_eq!(idx.cluster.uri_lengths.get(&10), Some(&1));
    // A cache moved to another URI moves its length.
    idx.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "m",
        "hf://org/mm",
        &["gpu"],
    ));
    assert_eq!(idx.cluster.uri_lengths.get(&10), None);
    assert_eq!(
        miss(&idx, &req("t", "hf://org/m/x")).reason,
        MissReason::NoMatch
    );
    hit_or_checked_miss(&idx, "hf://org/mm/x");
    for name in ["llama", "twin", "m"] {
        assert!(idx.remove_cache(&CacheScope::Cluster, name));
    }
    assert_eq!(idx, empty);
}

/// The cache matched (whatever the checks then say).
fn hit_or_checked_miss(idx: &CacheIndex, uri: &str) {
    match idx.lookup(&req("t", uri)) {
        Lookup::Hit(_) => {}
        Lookup::Miss(m) => assert!(m.cache.is_some(), "{uri}: {m:?}"),
    }
}

#[test]
fn a_model_uri_longer_than_the_limit_is_a_miss_without_a_lookup() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1"]));
    let at_limit = format!("hf://org/llama/{}", "a".repeat(MAX_MODEL_URI_LEN - 15));
    assert_eq!(at_limit.len(), MAX_MODEL_URI_LEN);
    hit(&idx, &req("team-a", &at_limit));
    let over = format!("{at_limit}b");
    let (m, n) = {
        let mut m = None;
        let n = probes(|| m = Some(miss(&idx, &req("team-a", &over))));
        (m.unwrap(), n)
    };
    assert_eq!((m.reason, m.cache, n), (MissReason::UriTooLong, None, 0));
    assert_eq!(MissReason::UriTooLong.as_str(), "uri-too-long");
    assert!(MissReason::ALL.contains(&MissReason::UriTooLong));
}

#[test]
fn a_full_hit_names_pvc_dir_sub_path_terms_and_downloaded_nodes() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1", "g2"]));
    let h = hit(&idx, &req("team-a", "hf://org/llama/sub/dir"));
    assert_eq!(h.pvc, "llama-gpu");
    assert_eq!(h.dir, storage_key("hf://org/llama"));
    assert_eq!(h.sub_path, "/sub/dir");
    assert_eq!(
        h.resolved_uri(),
        format!("pvc://llama-gpu/models/{}/sub/dir", h.dir)
    );
    let p = h.placement.unwrap();
    assert_eq!(p.node_group, "gpu");
    assert_eq!(p.hostnames, ["g1", "g2"]);
    assert_eq!(
        p.required_terms.as_deref(),
        Some(&[term("node-type", "In", &["gpu"])][..])
    );
}

/// The pin is by the `kubernetes.io/hostname` label (a label may differ from the node's name,
/// and many values are valid there, unlike `matchFields metadata.name`); a downloaded node
/// without the label cannot be pinned and is left out, and with none left the answer is a miss.
#[test]
fn the_pin_is_the_hostname_labels_of_the_downloaded_nodes() {
    let mut idx = cluster();
    idx.upsert_node(
        "g3",
        labels(&[
            ("kubernetes.io/hostname", "ip-10-0-0-3"),
            ("node-type", "gpu"),
        ]),
    );
    idx.upsert_node("g4", labels(&[("node-type", "gpu")]));
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1", "g3", "g4"]));
    let h = hit(&idx, &req("team-a", "hf://org/llama"));
    assert_eq!(h.placement.unwrap().hostnames, ["g1", "ip-10-0-0-3"]);

    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g4"]));
    let m = miss(&idx, &req("team-a", "hf://org/llama"));
    assert_eq!(m.reason, MissReason::NotDownloaded);
    assert_eq!(
        m.missing.as_deref(),
        Some(
            "no node of group gpu has NodeDownloaded (g4 NodeDownloaded but has no \
             kubernetes.io/hostname label to pin the pod to)"
        )
    );
}

/// A model downloaded on 50 nodes: one requirement with 50 values.
#[test]
fn a_model_on_fifty_nodes_is_one_pin_with_fifty_hostnames() {
    let mut idx = cluster();
    let names: Vec<String> = (0..50).map(|i| format!("gpu-{i:02}")).collect();
    for n in &names {
        idx.upsert_node(
            n.as_str(),
            labels(&[("kubernetes.io/hostname", n), ("node-type", "gpu")]),
        );
    }
    let on: Vec<&str> = names.iter().map(String::as_str).collect();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&on));
    assert_eq!(
        hit(&idx, &req("team-a", "hf://org/llama"))
            .placement
            .unwrap()
            .hostnames,
        names
    );
}

#[test]
fn cache_name_layout_uses_the_cache_name_as_directory() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1"]));
    let r = LookupRequest {
        layout: CacheLayout::CacheName,
        ..req("team-a", "hf://org/llama")
    };
    assert_eq!(hit(&idx, &r).volume_sub_path(), "models/llama");
}

#[test]
fn equal_or_slash_prefix_matches_and_lookalike_does_not() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1"]));
    hit(&idx, &req("team-a", "hf://org/llama"));
    hit(&idx, &req("team-a", "hf://org/llama/"));
    hit(&idx, &req("team-a", "hf://org/llama/x"));
    for other in ["hf://org/llama-evil", "hf://org/llam", "hf://org/Llama"] {
        let m = miss(&idx, &req("team-a", other));
        assert_eq!((m.reason, m.cache), (MissReason::NoMatch, None), "{other}");
    }
}

#[test]
fn one_trailing_slash_is_ignored_on_both_sides_and_only_one() {
    let mut idx = cluster();
    idx.upsert_cache(
        CacheEntry::new(CacheScope::Cluster, "llama", "hf://org/llama/", &["gpu"])
            .downloaded_on(&["g1"]),
    );
    assert_eq!(hit(&idx, &req("team-a", "hf://org/llama")).sub_path, "");
    // The storage key hashes the URI as written, slash included.
    assert_eq!(
        hit(&idx, &req("team-a", "hf://org/llama")).dir,
        storage_key("hf://org/llama/")
    );
    let mut idx = cluster();
    idx.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "llama",
        "hf://org/llama//",
        &["gpu"],
    ));
    assert_eq!(
        miss(&idx, &req("team-a", "hf://org/llama")).reason,
        MissReason::NoMatch
    );
}

#[test]
fn own_namespace_beats_cluster_and_other_namespaces_are_never_used() {
    let mut idx = cluster();
    idx.upsert_cache(
        CacheEntry::new(CacheScope::Cluster, "long", "hf://org/llama/v1", &["gpu"])
            .downloaded_on(&["g1"]),
    );
    idx.upsert_cache(
        CacheEntry::new(ns("team-a"), "llama", "hf://org", &["gpu"]).downloaded_on(&["g1"]),
    );
    idx.upsert_pvc("team-b", "long-gpu", BOUND);
    let h = hit(&idx, &req("team-a", "hf://org/llama/v1"));
    assert_eq!(h.cache.reference(), "namespace/team-a/llama");
    assert_eq!(h.sub_path, "/llama/v1");
    let h = hit(&idx, &req("team-b", "hf://org/llama/v1"));
    assert_eq!(h.cache.reference(), "cluster/long");
    assert_eq!(
        miss(&idx, &req("team-b", "hf://org/other")).reason,
        MissReason::NoMatch
    );
}

#[test]
fn longest_uri_then_smallest_name_wins() {
    let mut idx = cluster();
    for (name, uri) in [
        ("a-short", "hf://org"),
        ("z-long", "hf://org/m"),
        ("b-long", "hf://org/m/"),
    ] {
        idx.upsert_cache(
            CacheEntry::new(CacheScope::Cluster, name, uri, &["gpu"]).downloaded_on(&["g1"]),
        );
        idx.upsert_pvc("t", format!("{name}-gpu"), BOUND);
    }
    assert_eq!(hit(&idx, &req("t", "hf://org/m/f")).cache.name, "b-long");
    assert_eq!(hit(&idx, &req("t", "hf://org/n")).cache.name, "a-short");
}

#[test]
fn a_failed_check_never_falls_through_to_another_cache() {
    let mut idx = cluster();
    // team-a's own cache has no PVC for its group; the cluster cache would be a hit.
    idx.upsert_cache(
        CacheEntry::new(ns("team-a"), "mine", "hf://org/llama", &["gpu"]).downloaded_on(&["g1"]),
    );
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1"]));
    let m = miss(&idx, &req("team-a", "hf://org/llama"));
    assert_eq!(m.reason, MissReason::PvcMissing);
    assert_eq!(m.cache.unwrap().name, "mine");
    // Nor to a shorter match of the same scope.
    let mut idx = cluster();
    idx.upsert_cache(
        CacheEntry::new(CacheScope::Cluster, "llama", "hf://org", &["gpu"]).downloaded_on(&["g1"]),
    );
    idx.upsert_cache(CacheEntry::new(
        CacheScope::Cluster,
        "zz",
        "hf://org/llama",
        &["gpu"],
    ));
    assert_eq!(
        miss(&idx, &req("team-a", "hf://org/llama")).reason,
        MissReason::PvcMissing
    );
}

#[test]
fn requested_node_group_must_be_listed() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["cpu", "gpu"]).downloaded_on(&["g1", "c1"]));
    let r = LookupRequest {
        node_group: Some("gpu"),
        ..req("team-a", "hf://org/llama")
    };
    let h = hit(&idx, &r);
    assert_eq!(
        (h.pvc.as_str(), h.placement.unwrap().hostnames),
        ("llama-gpu", vec!["g1".to_string()])
    );
    let r = LookupRequest {
        node_group: Some("tpu"),
        ..req("team-a", "hf://org/llama")
    };
    let m = miss(&idx, &r);
    assert_eq!(m.reason, MissReason::NodeGroupMismatch);
    assert!(
        m.missing
            .unwrap()
            .contains("does not list the requested node group tpu")
    );
}

#[test]
fn without_a_request_the_first_group_that_fits_the_node_selector_is_chosen() {
    // kserve#5914: nodeGroups[0] is cpu, but the pod selects gpu nodes.
    let mut idx = cluster();
    idx.upsert_cache(llama(&["cpu", "gpu"]).downloaded_on(&["g1", "c1"]));
    let gpu = &[("node-type", "gpu")];
    let r = LookupRequest {
        node_selector: Some(&gpu[..]),
        ..req("team-a", "hf://org/llama")
    };
    assert_eq!(hit(&idx, &r).pvc, "llama-gpu");
    // No selector: the first listed group.
    assert_eq!(hit(&idx, &req("team-a", "hf://org/llama")).pvc, "llama-cpu");
    // Several pairs must hold on one node: gpu in zone b is g2; gpu in zone c is nobody.
    let zone_b = &[("node-type", "gpu"), ("zone", "b")];
    let r = LookupRequest {
        node_selector: Some(&zone_b[..]),
        ..req("team-a", "hf://org/llama")
    };
    // g2 is in the group but has not downloaded: the group fits, the check fails.
    assert_eq!(miss(&idx, &r).reason, MissReason::NotDownloaded);
    let zone_c = &[("node-type", "gpu"), ("zone", "c")];
    let r = LookupRequest {
        node_selector: Some(&zone_c[..]),
        ..req("team-a", "hf://org/llama")
    };
    let m = miss(&idx, &r);
    assert_eq!(m.reason, MissReason::NodeGroupMismatch);
    assert!(
        m.missing
            .unwrap()
            .contains("matches the pod's nodeSelector")
    );
    // A requested group must fit the selector too.
    let cpu = &[("node-type", "cpu")];
    let r = LookupRequest {
        node_group: Some("gpu"),
        node_selector: Some(&cpu[..]),
        ..req("team-a", "hf://org/llama")
    };
    assert_eq!(miss(&idx, &r).reason, MissReason::NodeGroupMismatch);
}

#[test]
fn a_missing_node_group_object_is_a_mismatch_naming_it() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["arm"]).downloaded_on(&["g1"]));
    let m = miss(&idx, &req("team-a", "hf://org/llama"));
    assert_eq!(m.reason, MissReason::NodeGroupMismatch);
    assert_eq!(m.missing.unwrap(), "LocalModelNodeGroup arm does not exist");
}

#[test]
fn pvc_must_exist_in_the_pods_namespace_not_be_deleted_nor_lost() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1"]));
    // team-b has no PVC: KServe made one only where an InferenceService uses the cache.
    let m = miss(&idx, &req("team-b", "hf://org/llama"));
    assert_eq!(m.reason, MissReason::PvcMissing);
    assert_eq!(m.missing.unwrap(), "PVC team-b/llama-gpu does not exist");
    idx.upsert_pvc(
        "team-b",
        "llama-gpu",
        PvcState {
            phase: PvcPhase::Bound,
            deleting: true,
            ..PvcState::default()
        },
    );
    assert!(
        miss(&idx, &req("team-b", "hf://org/llama"))
            .missing
            .unwrap()
            .ends_with("is being deleted")
    );
    idx.upsert_pvc("team-b", "llama-gpu", PvcState::provisioned(PvcPhase::Lost));
    assert!(
        miss(&idx, &req("team-b", "hf://org/llama"))
            .missing
            .unwrap()
            .ends_with("is Lost")
    );
    // Pending binds when the pod uses it (WaitForFirstConsumer); no phase yet is fine too.
    for phase in [PvcPhase::Pending, PvcPhase::Unknown] {
        idx.upsert_pvc("team-b", "llama-gpu", PvcState::provisioned(phase));
        hit(&idx, &req("team-b", "hf://org/llama"));
    }
    assert!(idx.remove_pvc("team-b", "llama-gpu"));
    assert_eq!(
        miss(&idx, &req("team-b", "hf://org/llama")).reason,
        MissReason::PvcMissing
    );
}

#[test]
fn downloaded_means_node_downloaded_on_a_known_node_of_the_group() {
    let mut idx = cluster();
    let mut cache = llama(&["gpu"]);
    let m = {
        idx.upsert_cache(cache.clone());
        miss(&idx, &req("team-a", "hf://org/llama"))
    };
    assert_eq!(m.reason, MissReason::NotDownloaded);
    assert!(m.missing.unwrap().contains("has no status.nodeStatus"));

    cache.status.set_node("g1", "NodeDownloading");
    // Downloaded on a cpu node and on a node that does not exist: neither serves gpu pods.
    cache.status.set_node("c1", "NodeDownloaded");
    cache.status.set_node("gone", "NodeDownloaded");
    idx.upsert_cache(cache.clone());
    let m = miss(&idx, &req("team-a", "hf://org/llama"));
    assert_eq!(m.reason, MissReason::NotDownloaded);
    let why = m.missing.unwrap();
    for part in [
        "g1 downloading",
        "c1 NodeDownloaded but not in node group gpu",
        "gone NodeDownloaded but Node gone does not exist",
    ] {
        assert!(why.contains(part), "{why}");
    }

    // g1 finishes: the pod is pinned to g1 only.
    cache.status.set_node("g1", "NodeDownloaded");
    idx.upsert_cache(cache);
    assert_eq!(
        hit(&idx, &req("team-a", "hf://org/llama"))
            .placement
            .unwrap()
            .hostnames,
        ["g1"]
    );
    // Downloaded nodes outside the pod's nodeSelector are left out, and none left is a miss.
    let zone_b = &[("zone", "b")];
    let r = LookupRequest {
        node_selector: Some(&zone_b[..]),
        ..req("team-a", "hf://org/llama")
    };
    assert_eq!(miss(&idx, &r).reason, MissReason::NotDownloaded);
}

#[test]
fn node_and_group_changes_move_membership() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["c1"]));
    assert_eq!(
        miss(&idx, &req("team-a", "hf://org/llama")).reason,
        MissReason::NotDownloaded
    );
    // c1 is relabelled into the gpu group.
    idx.upsert_node(
        "c1",
        labels(&[("kubernetes.io/hostname", "c1"), ("node-type", "gpu")]),
    );
    assert_eq!(
        hit(&idx, &req("team-a", "hf://org/llama"))
            .placement
            .unwrap()
            .hostnames,
        ["c1"]
    );
    // The group's affinity changes to zone a only: c1 has no zone now.
    idx.upsert_node_group("gpu", Some(vec![term("zone", "In", &["a"])]));
    assert_eq!(
        miss(&idx, &req("team-a", "hf://org/llama")).reason,
        MissReason::NotDownloaded
    );
    assert!(idx.remove_node("g1"));
    assert!(!idx.remove_node("g1"));
    // A PV without node affinity admits every node.
    idx.upsert_node_group("gpu", None);
    let h = hit(&idx, &req("team-a", "hf://org/llama"));
    assert_eq!(h.placement.unwrap().required_terms, None);
}

#[test]
fn node_selector_terms_follow_kubernetes_semantics() {
    let l = labels(&[("gpu", "a100"), ("count", "8")]);
    assert!(term_matches(&term("gpu", "In", &["a100", "h100"]), "n", &l));
    assert!(!term_matches(&term("gpu", "NotIn", &["a100"]), "n", &l));
    assert!(term_matches(&term("tpu", "NotIn", &["v5"]), "n", &l));
    assert!(term_matches(&term("gpu", "Exists", &[]), "n", &l));
    assert!(term_matches(&term("tpu", "DoesNotExist", &[]), "n", &l));
    assert!(term_matches(&term("count", "Gt", &["4"]), "n", &l));
    assert!(!term_matches(&term("count", "Lt", &["4"]), "n", &l));
    assert!(!term_matches(&term("gpu", "Gt", &["4"]), "n", &l));
    assert!(!term_matches(&term("gpu", "Bogus", &["a100"]), "n", &l));
    // An empty term matches nothing.
    assert!(!term_matches(&NodeSelectorTerm::default(), "n", &l));
    let by_name = NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec!["n".into()]),
        }]),
    };
    assert!(term_matches(&by_name, "n", &l));
    assert!(!term_matches(&by_name, "m", &l));
}

fn shared(pvc: &str) -> CacheEntry {
    CacheEntry {
        storage: CacheStorage::PvcRef(pvc.into()),
        ..CacheEntry::new(
            ns("my-models"),
            "llama3-8b",
            "hf://meta-llama/Meta-Llama-3-8B",
            &[],
        )
    }
}

#[test]
fn pvc_ref_mode_needs_the_pvc_and_a_finished_import_and_pins_no_node() {
    let mut idx = CacheIndex::new();
    let mut cache = shared("shared-models");
    idx.upsert_cache(cache.clone());
    let uri = "hf://meta-llama/Meta-Llama-3-8B";
    let m = miss(&idx, &req("my-models", uri));
    assert_eq!(m.reason, MissReason::PvcMissing);
    assert_eq!(
        m.missing.unwrap(),
        "PVC my-models/shared-models does not exist"
    );
    idx.upsert_pvc("my-models", "shared-models", BOUND);
    assert_eq!(
        miss(&idx, &req("my-models", uri)).reason,
        MissReason::NotDownloaded
    );
    cache.status.import_ready = true;
    idx.upsert_cache(cache);
    // A requested node group does not apply to a shared PVC; the cache-name layout neither
    // (shared-PVC mode exists only where KServe uses the storage key).
    let r = LookupRequest {
        node_group: Some("gpu"),
        layout: CacheLayout::CacheName,
        ..req("my-models", uri)
    };
    let h = hit(&idx, &r);
    assert_eq!(h.pvc, "shared-models");
    assert_eq!(h.dir, storage_key(uri));
    assert_eq!(h.placement, None);
}

#[test]
fn update_moves_and_delete_removes() {
    let mut idx = cluster();
    idx.upsert_cache(
        CacheEntry::new(ns("team-a"), "llama", "hf://a", &["gpu"]).downloaded_on(&["g1"]),
    );
    hit(&idx, &req("team-a", "hf://a"));
    idx.upsert_cache(
        CacheEntry::new(ns("team-a"), "llama", "hf://b", &["gpu"]).downloaded_on(&["g1"]),
    );
    assert_eq!(
        miss(&idx, &req("team-a", "hf://a")).reason,
        MissReason::NoMatch
    );
    hit(&idx, &req("team-a", "hf://b"));
    assert!(idx.remove_cache(&ns("team-a"), "llama"));
    assert_eq!(
        miss(&idx, &req("team-a", "hf://b")).reason,
        MissReason::NoMatch
    );
    assert!(!idx.remove_cache(&ns("team-a"), "llama"));
    let c = idx.counts();
    assert_eq!(
        (
            c.namespace_caches,
            c.cluster_caches,
            c.node_groups,
            c.pvcs,
            c.nodes
        ),
        (0, 0, 2, 2, 3)
    );
}

#[test]
fn merge_adds_and_overrides_every_kind_by_name() {
    let mut idx = CacheIndex::new();
    idx.upsert_cache(CacheEntry::new(ns("team-a"), "llama", "hf://old", &["gpu"]));
    idx.upsert_node_group("gpu", Some(vec![term("node-type", "In", &["gpu"])]));
    let mut other = cluster();
    other.upsert_cache(
        CacheEntry::new(ns("team-a"), "llama", "hf://new", &["gpu"]).downloaded_on(&["g1"]),
    );
    idx.merge(&other);
    let c = idx.counts();
    assert_eq!(
        (c.namespace_caches, c.node_groups, c.pvcs, c.nodes),
        (1, 2, 2, 3)
    );
    assert_eq!(
        miss(&idx, &req("team-a", "hf://old")).reason,
        MissReason::NoMatch
    );
    hit(&idx, &req("team-a", "hf://new"));
}

#[test]
fn reasons_have_the_spec_labels() {
    let labels: Vec<_> = MissReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        labels,
        [
            "no-match",
            "opted-out",
            "kserve-managed",
            "node-group-mismatch",
            "pvc-missing",
            "not-downloaded",
            "not-synced",
            "uri-too-long",
            "uri-not-normal"
        ]
    );
    // The counters index by discriminant.
    assert!(
        MissReason::ALL
            .iter()
            .enumerate()
            .all(|(i, r)| *r as usize == i)
    );
}

#[test]
fn a_status_keeps_one_state_per_node_in_name_order() {
    let s = CacheStatus::new(
        [
            ("b", "NodeDownloading"),
            ("a", "NodeDownloaded"),
            ("b", "NodeDownloaded"),
            ("c", "SomethingNew"),
        ],
        false,
    );
    let nodes: Vec<_> = s.nodes().map(|(n, st)| (n, st.as_str())).collect();
    assert_eq!(
        nodes,
        [
            ("a", "NodeDownloaded"),
            ("b", "NodeDownloaded"),
            ("c", "SomethingNew")
        ]
    );
    assert_eq!(s.node("b"), Some(&NodeState::Downloaded));
    assert_eq!(s.node("z"), None);
    assert!(s.reported);
}

#[test]
fn uris_with_dot_or_empty_segments_are_not_normal() {
    for uri in [
        "gs://b/models/../../etc",
        "gs://b/models/./x",
        "gs://b/models//x",
        "gs://b/models/%2e%2E/x",
        "gs://b/models/.%2e",
        "gs://b/models/%2E",
        "gs://b/models/a%2fb",
        "gs://b/models/a%2Fb",
        "s3://b/..",
    ] {
        assert!(!super::is_normal_uri(uri), "{uri}");
    }
    for uri in [
        "gs://b/models/llama",
        "gs://b/models/llama/",
        "hf://org/model",
        "gs://bucket",
        "pvc://claim/models/v1.2/...x",
        "gs://b/models/a.b/..c",
        "gs://b/%2e%2e%2e",
    ] {
        assert!(super::is_normal_uri(uri), "{uri}");
    }
}

#[test]
fn a_model_uri_with_dot_dot_is_a_miss_without_a_lookup() {
    let mut idx = cluster();
    idx.upsert_cache(llama(&["gpu"]).downloaded_on(&["g1"]));
    hit(&idx, &req("team-a", "hf://org/llama/x"));
    let (m, n) = {
        let mut m = None;
        let n = probes(|| m = Some(miss(&idx, &req("team-a", "hf://org/llama/../../x"))));
        (m.unwrap(), n)
    };
    assert_eq!((m.reason, m.cache, n), (MissReason::UriNotNormal, None, 0));
    assert_eq!(MissReason::UriNotNormal.as_str(), "uri-not-normal");
    assert!(MissReason::ALL.contains(&MissReason::UriNotNormal));
}

// ---------------------------------------------------------------------------------------------
// What a tenant's objects can cost (docs/model-cache.md, "Bounds"; docs/security.md, "What a
// namespace can do to the others")

/// A cache of `team-a` that lists `groups`, downloaded on g1 and c1, with its PVCs.
fn team_a_cache(groups: Vec<String>) -> CacheIndex {
    let mut idx = cluster();
    idx.upsert_cache(
        CacheEntry::from_parts(
            ns("team-a"),
            "llama".into(),
            "hf://org/llama".into(),
            CacheStorage::NodeGroups(groups),
            CacheStatus::default(),
        )
        .downloaded_on(&["g1", "c1"]),
    );
    idx
}

#[test]
fn a_node_group_mismatch_costs_its_bound_whatever_the_cache_lists_and_the_pod_selects() {
    // The finding: nodeGroups ["gpu"] × 150 000 and a nodeSelector of 40 pairs no gpu node
    // satisfies built one reason per listed group, each with the whole selector (3.6 s).
    let idx = team_a_cache(vec!["gpu".to_string(); 150_000]);
    let pairs: Vec<(String, String)> = (0..40)
        .map(|i| (format!("label-{i:02}"), "x".repeat(60)))
        .collect();
    let mut selector: Vec<(&str, &str)> = vec![("node-type", "gpu")];
    selector.extend(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    selector.sort();
    let r = LookupRequest {
        node_selector: Some(&selector),
        ..req("team-a", "hf://org/llama")
    };
    let started = std::time::Instant::now();
    let m = miss(&idx, &r);
    let took = started.elapsed();
    assert_eq!(m.reason, MissReason::NodeGroupMismatch);
    let missing = m.missing.unwrap();
    assert!(missing.len() <= super::MAX_MISSING_LEN, "{}", missing.len());
    assert!(
        missing.starts_with("no Node of LocalModelNodeGroup gpu matches the pod's nodeSelector {"),
        "{missing}"
    );
    assert!(missing.ends_with('…'), "{missing}");
    // One probe per group kept and per pair: microseconds, not seconds (a debug build on a
    // loaded machine: a generous bound).
    assert!(took < std::time::Duration::from_millis(50), "{took:?}");

    // Groups that do not exist and groups that do not fit: one sentence each, bounded.
    let mut groups: Vec<String> = (0..200).map(|i| format!("absent-{i}")).collect();
    groups.extend(["gpu".to_string(), "cpu".to_string()]);
    let idx = team_a_cache(groups);
    let zone_c = [("zone", "c")];
    let r = LookupRequest {
        node_selector: Some(&zone_c),
        ..req("team-a", "hf://org/llama")
    };
    let missing = miss(&idx, &r).missing.unwrap();
    assert!(missing.len() <= super::MAX_MISSING_LEN, "{missing}");
    assert!(
        missing.starts_with(
            "LocalModelNodeGroup absent-0 does not exist; LocalModelNodeGroup absent-1"
        ),
        "{missing}"
    );
    // Two that exist and do not fit, and nothing absent: named together, the selector once.
    let idx = team_a_cache(vec!["gpu".into(), "cpu".into(), "gpu".into()]);
    let missing = miss(&idx, &r).missing.unwrap();
    assert_eq!(
        missing,
        "no Node of LocalModelNodeGroups gpu, cpu matches the pod's nodeSelector {zone=c}"
    );
    // The requested group not listed: the list is cut at the bound.
    let many: Vec<String> = (0..MAX_NODE_GROUPS_TEST)
        .map(|i| "g".repeat(40) + &i.to_string())
        .collect();
    let idx = team_a_cache(many);
    let r = LookupRequest {
        node_group: Some("tpu"),
        ..req("team-a", "hf://org/llama")
    };
    let missing = miss(&idx, &r).missing.unwrap();
    assert!(missing.len() <= super::MAX_MISSING_LEN, "{missing}");
    assert!(missing.starts_with("it does not list the requested node group tpu (nodeGroups: ggg"));
}

const MAX_NODE_GROUPS_TEST: usize = crate::cache::bounds::MAX_NODE_GROUPS;

#[test]
fn an_entry_keeps_its_node_groups_deduplicated_and_capped_whoever_builds_it() {
    let idx = team_a_cache(vec!["cpu".to_string(); 150_000]);
    let h = hit(&idx, &req("team-a", "hf://org/llama"));
    assert_eq!(h.cache.node_groups(), ["cpu"]);
    let groups: Vec<String> = (0..100).map(|i| format!("g{i}")).collect();
    let e = CacheEntry::from_parts(
        ns("team-a"),
        "x".into(),
        "hf://x".into(),
        CacheStorage::NodeGroups(groups),
        CacheStatus::default(),
    );
    assert_eq!(e.node_groups().len(), MAX_NODE_GROUPS_TEST);
    assert_eq!(e.node_groups()[0], "g0");
}

#[test]
fn a_status_keeps_what_routing_and_its_message_use_within_bounds() {
    let names: Vec<String> = (0..12_000).map(|i| format!("n{i:05}")).collect();
    let long = "n".repeat(super::MAX_NAME_LEN + 1);
    let entries = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let state = if i % 2 == 0 {
                "NodeDownloaded"
            } else {
                "NodeDownloading"
            };
            (n.as_str(), state)
        })
        .chain([(long.as_str(), "NodeDownloaded")]);
    let (s, dropped) = CacheStatus::bounded(entries, false);
    let downloaded = s
        .nodes()
        .filter(|(_, st)| **st == NodeState::Downloaded)
        .count();
    assert_eq!(downloaded, super::MAX_DOWNLOADED_NODES);
    // The long name, and the NodeDownloaded entries past the cap; the other states beyond the
    // first few are not counted (only a message uses them).
    assert_eq!(dropped, 1 + 6_000 - super::MAX_DOWNLOADED_NODES);
    let others: Vec<&str> = s
        .nodes()
        .filter(|(_, st)| **st != NodeState::Downloaded)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(others, ["n00001", "n00003", "n00005"]);
    // An unknown state is kept as far as a message shows it.
    let odd = "Weird".repeat(1_000);
    let s = CacheStatus::new([("a", odd.as_str())], false);
    assert!(s.node("a").unwrap().as_str().len() <= 64);
}

#[test]
fn caches_sharing_one_uri_resolve_by_name_and_change_at_the_cost_of_one() {
    let uri = "hf://org/shared";
    let add = |idx: &mut CacheIndex, i: usize| {
        idx.upsert_cache(
            CacheEntry::new(ns("team-a"), &format!("c{i:06}"), uri, &["gpu"])
                .downloaded_on(&["g1"]),
        );
    };
    let mut idx = cluster();
    for i in (0..3_000).rev() {
        add(&mut idx, i);
    }
    for i in 0..3 {
        idx.upsert_pvc("team-a", format!("c{i:06}-gpu"), BOUND);
    }
    let name = |idx: &CacheIndex| match idx.lookup(&req("team-a", uri)) {
        Lookup::Hit(h) => h.cache.name.clone(),
        Lookup::Miss(m) => format!("miss {:?}", m.cache.map(|c| c.name.clone())),
    };
    assert_eq!(name(&idx), "c000000");
    let snapshot = idx.clone();
    assert!(idx.remove_cache(&ns("team-a"), "c000000"));
    assert_eq!(name(&idx), "c000001");
    assert_eq!(name(&snapshot), "c000000", "a snapshot does not move");
    // Down to one, then none: the same index a rebuild gives.
    for i in 2..3_000 {
        assert!(idx.remove_cache(&ns("team-a"), &format!("c{i:06}")));
    }
    assert_eq!(name(&idx), "c000001");
    let mut rebuilt = cluster();
    for i in 0..3 {
        rebuilt.upsert_pvc("team-a", format!("c{i:06}-gpu"), BOUND);
    }
    add(&mut rebuilt, 1);
    assert!(idx == rebuilt, "one left is kept as one");
    assert!(idx.remove_cache(&ns("team-a"), "c000001"));
    assert_eq!(
        idx.lookup(&req("team-a", uri)).reason(),
        Some(MissReason::NoMatch)
    );
    // The same URI written with a trailing slash is the same key.
    idx.upsert_cache(CacheEntry::new(
        ns("team-a"),
        "b",
        "hf://org/shared/",
        &["gpu"],
    ));
    idx.upsert_cache(CacheEntry::new(
        ns("team-a"),
        "a",
        "hf://org/shared",
        &["gpu"],
    ));
    assert_eq!(
        miss(&idx, &req("team-a", uri)).cache.unwrap().name,
        "a",
        "the smallest name of both spellings"
    );

    // Adding k caches of one URI costs O(k log k), not O(k²): four times the caches take about
    // four times as long (a copied list made it sixteen). The best of three runs of each.
    let burst = |k: usize| {
        (0..3)
            .map(|_| {
                let mut idx = CacheIndex::new();
                let started = std::time::Instant::now();
                for i in 0..k {
                    add(&mut idx, i);
                    // A snapshot published after each change, as the watch may.
                    drop(idx.clone());
                }
                started.elapsed()
            })
            .min()
            .unwrap()
    };
    let (small, large) = (burst(2_000), burst(8_000));
    let ratio = large.as_secs_f64() / small.as_secs_f64();
    assert!(ratio < 8.0, "{small:?} → {large:?}: ×{ratio:.1}");
}

#[test]
fn a_cache_uri_is_stored_once() {
    let mut idx = CacheIndex::new();
    let entry = Arc::new(CacheEntry::new(ns("team-a"), "m", "hf://org/m/", &["gpu"]));
    idx.upsert_cache(entry.clone());
    let scope = idx.namespaces.get("team-a").unwrap();
    let (key, _) = scope.by_uri.iter().next().unwrap();
    assert!(
        Arc::ptr_eq(&key.0, &entry.source_model_uri),
        "the key is the entry's URI"
    );
    assert_eq!(key.trimmed(), "hf://org/m");
}
