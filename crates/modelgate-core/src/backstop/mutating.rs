//! docs/policy.md §13, "The MAP": the MutatingAdmissionPolicy of the backstop. [`objects`]
//! renders it and its binding from the same [`PolicyConfig`] the webhooks run on. It does what
//! §3 does on a Pod or Job CREATE while no modelgate replica answers, and nothing else:
//!
//! - the pod's `runAsNonRoot: true` (also where it says `false`);
//! - the pod's `runAsUser` and `runAsGroup` where the pod has none and `/mutate` would set one,
//!   with the value `/mutate` would set (`--run-as-user`, `--run-as-group`; under
//!   `--model-cache-prep never`, or where the prep is withheld, a pod with the cache volume runs
//!   as `--init-container-user`); never on a Windows pod, never a `none` setting;
//! - a container's `runAsNonRoot: false` (init and regular containers) turned `true`;
//! - the annotation [`SET_BY_POLICY`] on the object (a Pod's, a Job's own metadata, never the
//!   template its pods copy) that lists what it set, which `/mutate` reads, reports as its own
//!   and removes.
//!
//! It never touches an init container named `model-cache-prep` (`/mutate` replaces or leaves
//! it, the VAP judges it), never injects the prep, sets no fsGroup, routes no model. Where
//! `/mutate`'s choice of a uid depends on what the MAP cannot see (a cache volume on a named
//! claim: whether the claim exists, who chose its volume, its class), it sets the uid only
//! when both answers agree, and else leaves it to `/mutate` (the VAP does not require a uid).
//! So whatever it sets, `/mutate` sets the same, and `/mutate` run after it gives the same
//! object and warnings as `/mutate` alone.
//!
//! - `failurePolicy: Ignore`: an error skips the mutation, and the VAP then judges the object
//!   as it came, so an error can refuse nothing compliant and let nothing through;
//! - `reinvocationPolicy: IfNeeded`: a webhook that runs after it (a sidecar injector) may add
//!   a container that says `runAsNonRoot: false`; the MAP repairs it on the second pass, and
//!   `/mutate`, reinvoked, reads what the second pass set.
//!
//! Every value a policy flag gives is a variable at the top of the policy (as the VAP's
//! [`super::config_variables`]): the variables and the mutation are the same text whatever the
//! flags. The `matchConditions`, the namespace selectors and the names are the VAP's own (the
//! selection: opt-in label, exempt namespaces, service account, priority classes), which the
//! chart already renders for the VAP.

use serde_json::{Value, json};

use super::{
    HOST_PATH_ALLOWED, Selection, cel_json, cel_list, cel_string, config_variables,
    derived_variables, labels, match_conditions, namespace_selector,
};
use crate::config::{PREBOUND, PREP_CONTAINER, PolicyConfig};
use crate::namespaces::POD_SECURITY_ENFORCE_LABEL;
use crate::policy::cache_prep::{NOT_CACHE_STORAGE, PROVISIONED};
use crate::policy::{ContainerList, POD_FIELDS, SET_BY_POLICY, container_entry, pod_entry};

/// The MAP's name and its binding's, after the VAP's (`modelgate-backstop-nonroot`).
pub fn name(sel: &Selection) -> String {
    format!("{}-nonroot", sel.name)
}

/// Why `backstop --mutating` prints nothing: the MAP could not agree with `/mutate`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MutatingError {
    /// The previous release's settings of §3 differ: during the upgrade, replicas of either
    /// release answer, and one MAP cannot set what both would.
    #[error(
        "--previous-values: the previous release runs with another {flag} ({previous} instead \
         of {current}); during the upgrade a MutatingAdmissionPolicy cannot set what the \
         /mutate of both releases would set. Print it without --mutating until the upgrade is \
         done, then with --mutating and without --previous-values"
    )]
    PreviousSettings {
        flag: &'static str,
        previous: String,
        current: String,
    },
}

/// The settings the MAP reads, each a variable holding one literal, with the flag it comes
/// from: the VAP's that §3 reads, then its own.
pub fn settings(cfg: &PolicyConfig) -> Vec<(String, String, &'static str)> {
    let from_vap = [
        ("prepAlways", "--model-cache-prep"),
        ("defaultCacheVolume", "--cache-volume"),
        ("initContainerUser", "--init-container-user"),
        ("podSecurityDefault", "--pod-security-default"),
        ("prepVolumeTypes", "--prep-volume-type"),
        ("prepHostPaths", "--prep-host-path"),
    ];
    let vap = config_variables(cfg);
    let mut out: Vec<(String, String, &'static str)> = from_vap
        .iter()
        .map(|(name, flag)| {
            let literal = vap
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, l)| l.clone())
                .expect("a setting of the VAP");
            (name.to_string(), literal, *flag)
        })
        .collect();
    // `none` is -1: no uid or gid is ever negative.
    out.push((
        "runAsUser".into(),
        cfg.run_as_user.value().unwrap_or(-1).to_string(),
        "--run-as-user",
    ));
    out.push((
        "runAsGroup".into(),
        cfg.run_as_group.value().unwrap_or(-1).to_string(),
        "--run-as-group",
    ));
    out.push((
        "prepStorageClasses".into(),
        cel_json(&json!(cfg.prep_storage_classes)),
        "--prep-storage-class",
    ));
    out
}

/// The MAP and its binding, in the order `kubectl apply` should create them.
pub fn objects(cfg: &PolicyConfig, sel: &Selection) -> [Value; 2] {
    [policy(cfg, sel), binding(cfg, sel)]
}

/// [`objects`] during an upgrade from the settings `previous`: refused when they differ in
/// what §3 reads.
pub fn objects_across_upgrade(
    cfg: &PolicyConfig,
    previous: &PolicyConfig,
    sel: &Selection,
) -> Result<[Value; 2], MutatingError> {
    for ((_, current, flag), (_, before, _)) in settings(cfg).into_iter().zip(settings(previous)) {
        if current != before {
            return Err(MutatingError::PreviousSettings {
                flag,
                previous: before,
                current,
            });
        }
    }
    Ok(objects(cfg, sel))
}

fn policy(cfg: &PolicyConfig, sel: &Selection) -> Value {
    let rule = |group: &str, resource: &str| {
        json!({
            "apiGroups": [group],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": [resource],
            "scope": "Namespaced",
        })
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name(sel), "labels": labels()},
        "spec": {
            "failurePolicy": "Ignore",
            "reinvocationPolicy": "IfNeeded",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "namespaceSelector": namespace_selector(cfg, sel, false),
                "resourceRules": [rule("", "pods"), rule("batch", "jobs")],
            },
            "matchConditions": match_conditions(cfg, sel),
            "variables": variables(cfg, sel)
                .into_iter()
                .map(|(name, expression)| json!({"name": name, "expression": expression}))
                .collect::<Vec<_>>(),
            "mutations": [{
                "patchType": "ApplyConfiguration",
                "applyConfiguration": {"expression": mutation()},
            }],
        },
    })
}

/// Bound exactly where the VAP is: the opted-in namespaces in `enforce`, no exempt one, none
/// opened for exceptions (`modelgate.io/exceptions: allowed`).
fn binding(cfg: &PolicyConfig, sel: &Selection) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name(sel), "labels": labels()},
        "spec": {
            "policyName": name(sel),
            "matchResources": {
                "namespaceSelector": namespace_selector(cfg, sel, true),
            },
        },
    })
}

/// The VAP's variables the MAP reads verbatim (the pod, its cache volume, Windows).
const FROM_VAP: [&str; 5] = ["template", "pod", "annotations", "cacheVolume", "windows"];

/// `variables.pod.<list>`, or `[]` without it (absent, or `null` as the typed object
/// serializes a pod without containers).
fn list(name: &str) -> String {
    format!(
        "(has(variables.pod.{name}) && variables.pod.{name} != null ? variables.pod.{name} : [])"
    )
}

/// `c` lacks its own `field`.
fn lacks(field: &str) -> String {
    format!("!(has(c.securityContext) && has(c.securityContext.{field}))")
}

/// The MAP's variables, in order: the settings, then §3 as the webhook decides it
/// (`policy/nonroot.rs`, `policy/cache_prep.rs`).
pub fn variables(cfg: &PolicyConfig, sel: &Selection) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = settings(cfg)
        .into_iter()
        .map(|(name, literal, _)| (name, literal))
        .collect();
    let vap = derived_variables(cfg, sel);
    for name in FROM_VAP {
        let (_, expression) = vap
            .iter()
            .find(|(n, _)| n == name)
            .expect("a variable of the VAP");
        v.push((name.to_string(), expression.clone()));
    }
    let prep = cel_string(PREP_CONTAINER);
    let not_storage = cel_list(NOT_CACHE_STORAGE);
    let known: Vec<&str> = PROVISIONED
        .iter()
        .chain(&["hostPath"])
        .chain(&NOT_CACHE_STORAGE)
        .copied()
        .collect();
    let template_spec = "variables.cacheVolumes[0].ephemeral.?volumeClaimTemplate.?spec";
    let derived: Vec<(&str, String)> = vec![
        // Pod Security `restricted` by the namespace's label, else `--pod-security-default`.
        (
            "restricted",
            format!(
                "(namespaceObject != null && has(namespaceObject.metadata) \
                 && has(namespaceObject.metadata.labels) \
                 && {label} in namespaceObject.metadata.labels \
                 ? namespaceObject.metadata.labels[{label}] : variables.podSecurityDefault) \
                 == 'restricted'",
                label = cel_string(POD_SECURITY_ENFORCE_LABEL),
            ),
        ),
        (
            "cacheVolumes",
            format!(
                "{}.filter(v, v.name == variables.cacheVolume)",
                list("volumes")
            ),
        ),
        // "The pod mounts the model cache": a source, none that is not storage.
        (
            "writableCache",
            format!(
                "variables.cacheVolumes.exists(v, v.exists(k, k != 'name') \
                 && !v.exists(k, k in {not_storage}))"
            ),
        ),
        // Storage the pod names that the operator did not allow: a host path outside
        // `--prep-host-path`, an inline type not in `--prep-volume-type`.
        (
            "podNamedStorage",
            format!(
                "variables.cacheVolumes.exists(v, !{HOST_PATH_ALLOWED}) \
                 || variables.cacheVolumes.exists(v, v.exists(k, k != 'name' \
                 && !(k in {known}) && !(k in variables.prepVolumeTypes)))",
                known = cel_list(&known),
            ),
        ),
        // An ephemeral volume's claim template whose volume its author picked (without
        // `--prep-volume-type prebound`), or of a class `--prep-storage-class` leaves out.
        (
            "templateRefused",
            format!(
                "size(variables.cacheVolumes) > 0 \
                 && !has(variables.cacheVolumes[0].persistentVolumeClaim) \
                 && has(variables.cacheVolumes[0].ephemeral) \
                 && (({template_spec}.?volumeName.orValue('') != '' \
                 || {template_spec}.?selector.hasValue()) && !({prebound} in variables.prepVolumeTypes) \
                 || size(variables.prepStorageClasses) > 0 \
                 && !({template_spec}.?storageClassName.orValue('') in variables.prepStorageClasses))",
                prebound = cel_string(PREBOUND),
            ),
        ),
        (
            "withheld",
            "variables.restricted || variables.podNamedStorage || variables.templateRefused".into(),
        ),
        // A named claim: whether it exists, who chose its volume and its class are not in the
        // request, so whether the prep is withheld is unknown here.
        (
            "namedClaim",
            "size(variables.cacheVolumes) > 0 \
             && has(variables.cacheVolumes[0].persistentVolumeClaim)"
                .into(),
        ),
        // Whether modelgate manages the prep: 'yes', 'no', or 'unknown' (a named claim).
        (
            "prepManaged",
            "!variables.prepAlways || variables.windows || !variables.writableCache \
             || variables.withheld ? 'no' : (variables.namedClaim ? 'unknown' : 'yes')"
                .into(),
        ),
        // The containers §3 governs: all, or all but the init containers named like the prep
        // where modelgate manages the prep (it replaces them).
        (
            "containersAll",
            format!(
                "{} + {} + {}",
                list("initContainers"),
                list("containers"),
                list("ephemeralContainers")
            ),
        ),
        (
            "containersManaged",
            format!(
                "{}.filter(c, c.name != {prep}) + {} + {}",
                list("initContainers"),
                list("containers"),
                list("ephemeralContainers")
            ),
        ),
        (
            "lacksUserAll",
            format!("variables.containersAll.exists(c, {})", lacks("runAsUser")),
        ),
        (
            "lacksUserManaged",
            format!(
                "variables.containersManaged.exists(c, {})",
                lacks("runAsUser")
            ),
        ),
        (
            "lacksGroupAll",
            format!("variables.containersAll.exists(c, {})", lacks("runAsGroup")),
        ),
        (
            "lacksGroupManaged",
            format!(
                "variables.containersManaged.exists(c, {})",
                lacks("runAsGroup")
            ),
        ),
        (
            "podHas",
            "has(variables.pod.securityContext) ? variables.pod.securityContext : {}".into(),
        ),
        // The uid `/mutate` sets, -1 for none. Managed: `--run-as-user`. Not managed: under
        // `never` (the setting, or withheld) a pod with the cache runs as the cache's owner.
        // Unknown: set only when both answers agree.
        (
            "uidManaged",
            "variables.lacksUserManaged ? variables.runAsUser : -1".into(),
        ),
        (
            "uidUnmanaged",
            "variables.lacksUserAll ? ((!variables.prepAlways || variables.withheld \
             || variables.prepManaged == 'unknown') && variables.writableCache \
             ? variables.initContainerUser : variables.runAsUser) : -1"
                .into(),
        ),
        (
            "uid",
            "variables.windows || 'runAsUser' in variables.podHas ? -1 \
             : (variables.prepManaged == 'yes' ? variables.uidManaged \
             : (variables.prepManaged == 'no' ? variables.uidUnmanaged \
             : (variables.uidManaged == variables.uidUnmanaged ? variables.uidManaged : -1)))"
                .into(),
        ),
        (
            "gidManaged",
            "variables.lacksGroupManaged ? variables.runAsGroup : -1".into(),
        ),
        (
            "gidUnmanaged",
            "variables.lacksGroupAll ? variables.runAsGroup : -1".into(),
        ),
        (
            "gid",
            "variables.windows || 'runAsGroup' in variables.podHas ? -1 \
             : (variables.prepManaged == 'yes' ? variables.gidManaged \
             : (variables.prepManaged == 'no' ? variables.gidUnmanaged \
             : (variables.gidManaged == variables.gidUnmanaged ? variables.gidManaged : -1)))"
                .into(),
        ),
        (
            "nonRoot",
            "!('runAsNonRoot' in variables.podHas && variables.podHas.runAsNonRoot == true)".into(),
        ),
        // The containers that say `runAsNonRoot: false`, by name; never an init container
        // named like the prep.
        (
            "fixInit",
            format!(
                "{}.filter(c, c.name != {prep} && has(c.securityContext) \
                 && has(c.securityContext.runAsNonRoot) \
                 && c.securityContext.runAsNonRoot == false).map(c, c.name)",
                list("initContainers")
            ),
        ),
        (
            "fixContainers",
            format!(
                "{}.filter(c, has(c.securityContext) \
                 && has(c.securityContext.runAsNonRoot) \
                 && c.securityContext.runAsNonRoot == false).map(c, c.name)",
                list("containers")
            ),
        ),
        ("setByPolicy", set_by_policy()),
    ];
    v.extend(derived.into_iter().map(|(n, e)| (n.to_string(), e)));
    v
}

/// The annotation's value: the entries of what the MAP sets (`policy/nonroot.rs` writes and
/// reads the same), `,`-separated; `''` when it sets nothing.
fn set_by_policy() -> String {
    let [non_root, user, group] = POD_FIELDS.map(|f| cel_string(&pod_entry(f)));
    let per_container = |list: ContainerList, variable: &str| {
        const MARK: &str = "\u{1}";
        let entry = container_entry(list, MARK);
        let (before, after) = entry.split_once(MARK).expect("the name is in the entry");
        format!(
            "variables.{variable}.map(n, {} + n + {})",
            cel_string(before),
            cel_string(after)
        )
    };
    format!(
        "((variables.nonRoot ? [{non_root}] : []) + (variables.uid >= 0 ? [{user}] : []) \
         + (variables.gid >= 0 ? [{group}] : []) + {} + {}).join(',')",
        per_container(ContainerList::Init, "fixInit"),
        per_container(ContainerList::Regular, "fixContainers"),
    )
}

/// The one mutation: an apply configuration of the pod (a Job's template), merged into the
/// object. Containers are a list keyed by name, so each is merged by its name; a field the MAP
/// does not set is left out (`?field: optional.none()`), and nothing at all is written when
/// there is nothing to set.
fn mutation() -> String {
    let pod = |p: &str| {
        format!(
            "{p}{{?securityContext: variables.nonRoot || variables.uid >= 0 || variables.gid >= 0 \
             ? optional.of({p}.securityContext{{\
             ?runAsNonRoot: variables.nonRoot ? optional.of(true) : optional.none(), \
             ?runAsUser: variables.uid >= 0 ? optional.of(variables.uid) : optional.none(), \
             ?runAsGroup: variables.gid >= 0 ? optional.of(variables.gid) : optional.none()}}) \
             : optional.none(), \
             ?initContainers: size(variables.fixInit) > 0 ? optional.of(variables.fixInit.map(n, \
             {p}.initContainers{{name: n, securityContext: \
             {p}.initContainers.securityContext{{runAsNonRoot: true}}}})) : optional.none(), \
             ?containers: size(variables.fixContainers) > 0 ? optional.of(variables.fixContainers.map(n, \
             {p}.containers{{name: n, securityContext: \
             {p}.containers.securityContext{{runAsNonRoot: true}}}})) : optional.none()}}"
        )
    };
    // On the object's own metadata (a Job's, never its template's, which its pods would copy).
    let metadata = format!(
        "Object.metadata{{annotations: {{{}: variables.setByPolicy}}}}",
        cel_string(SET_BY_POLICY)
    );
    format!(
        "variables.setByPolicy == '' ? Object{{}} \
         : (request.kind.kind == 'Pod' \
         ? Object{{metadata: {metadata}, spec: {}}} \
         : Object{{metadata: {metadata}, \
         spec: Object.spec{{template: Object.spec.template{{spec: {}}}}}}})",
        pod("Object.spec"),
        pod("Object.spec.template.spec"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text of every expression but the settings is the same whatever the flags, so that
    /// the chart can copy it and write only the settings.
    #[test]
    fn only_the_settings_depend_on_the_flags() {
        let sel = Selection::new("modelgate-system", "modelgate");
        let default = PolicyConfig::default();
        let other = PolicyConfig {
            run_as_user: crate::config::IdSetting::None,
            run_as_group: crate::config::IdSetting::Set(7),
            init_container_user: 5,
            model_cache_prep: crate::config::PrepMode::Never,
            cache_volume: "x".into(),
            prep_volume_types: vec!["nfs".into()],
            prep_host_paths: vec!["/data".into()],
            prep_storage_classes: vec!["fast".into()],
            pod_security_default: crate::config::PodSecurityLevel::Restricted,
            ..PolicyConfig::default()
        };
        let n = settings(&default).len();
        let a = variables(&default, &sel);
        let b = variables(&other, &sel);
        assert_eq!(a[n..], b[n..]);
        for (i, ((name, x), (_, y))) in a[..n].iter().zip(&b[..n]).enumerate() {
            assert_ne!(x, y, "setting {i} ({name}) should differ");
        }
    }

    #[test]
    fn a_previous_release_with_other_settings_is_refused_naming_the_flag() {
        let sel = Selection::new("modelgate-system", "modelgate");
        let cfg = PolicyConfig::default();
        assert!(objects_across_upgrade(&cfg, &cfg.clone(), &sel).is_ok());
        let previous = PolicyConfig {
            run_as_user: crate::config::IdSetting::Set(2000),
            ..PolicyConfig::default()
        };
        let err = objects_across_upgrade(&cfg, &previous, &sel).unwrap_err();
        assert!(err.to_string().contains("--run-as-user"), "{err}");
        // A change the MAP does not read (the prep's image) is no reason to refuse.
        let previous = PolicyConfig {
            init_image: "other".into(),
            ..PolicyConfig::default()
        };
        assert!(objects_across_upgrade(&cfg, &previous, &sel).is_ok());
    }
}
