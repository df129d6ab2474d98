//! The pull credentials of the cluster's workloads, as the kubelet finds them
//! (docs/images.md#pull-secrets-from-the-cluster): a pod's `imagePullSecrets`, or, for a
//! template that names none, those of its ServiceAccount, which the ServiceAccount admission
//! plugin copies into each pod that names none. Secrets of type
//! `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`) and `kubernetes.io/dockercfg`
//! (`.dockercfg`) are read; every ServiceAccount and Secret is asked for once per run, at most
//! [`CONCURRENCY`] at once. What cannot be used (missing, forbidden, malformed, another type)
//! is a finding naming it and the workload, never a failure of the run. Nothing here prints a
//! credential: a Secret's content is parsed and kept as [`Credentials`], whose `Debug` names
//! only registries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::Api;

use super::registry::Credentials;
use super::{ContainerUse, PullSecretFinding};
use crate::audit::cluster::reason;

/// ServiceAccounts and Secrets asked for at once.
pub const CONCURRENCY: usize = 8;

/// The label of a pull secret's credentials in output.
pub fn label(namespace: &str, name: &str) -> String {
    format!("pull secret {namespace}/{name}")
}

/// Each container's pull credentials: `(label, credentials)` in the kubelet's order, and the
/// `NAMESPACE/NAME` of the secrets it uses.
pub type Keyring = Vec<(String, Arc<Credentials>)>;

/// What [`resolve`] found.
#[derive(Default)]
pub struct Resolved {
    /// By container, in the order given.
    pub keyrings: Vec<Keyring>,
    pub secret_names: Vec<Vec<String>>,
    pub findings: Vec<PullSecretFinding>,
    /// GET calls made: ServiceAccounts, Secrets.
    pub gets: (usize, usize),
}

/// Reads the ServiceAccounts and Secrets `containers` need, each once.
pub async fn resolve(client: &kube::Client, containers: &[ContainerUse]) -> Resolved {
    // The ServiceAccounts whose secrets stand in for a template's own (none named).
    let accounts: BTreeSet<(String, String)> = containers
        .iter()
        .filter(|c| c.pull.secrets.is_empty())
        .filter_map(|c| Some((c.namespace.clone(), c.pull.service_account.clone()?)))
        .collect();
    let got_accounts: BTreeMap<(String, String), Result<Vec<String>, String>> =
        futures::stream::iter(accounts)
            .map(|(ns, name)| async move {
                let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
                let r = api
                    .get(&name)
                    .await
                    .map(|sa| {
                        sa.image_pull_secrets
                            .unwrap_or_default()
                            .into_iter()
                            .map(|r| r.name)
                            .filter(|n| !n.is_empty())
                            .collect()
                    })
                    .map_err(|e| account_problem(&e));
                ((ns, name), r)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
    // Each container's secret names, as the kubelet gets them.
    let names: Vec<Vec<String>> = containers
        .iter()
        .map(|c| {
            if !c.pull.secrets.is_empty() {
                return c.pull.secrets.clone();
            }
            c.pull
                .service_account
                .as_ref()
                .and_then(|sa| got_accounts.get(&(c.namespace.clone(), sa.clone())))
                .and_then(|r| r.as_ref().ok())
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let wanted: BTreeSet<(String, String)> = containers
        .iter()
        .zip(&names)
        .flat_map(|(c, names)| names.iter().map(|n| (c.namespace.clone(), n.clone())))
        .collect();
    let got_secrets: BTreeMap<(String, String), Result<Arc<Credentials>, String>> =
        futures::stream::iter(wanted)
            .map(|(ns, name)| async move {
                let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
                let r = match api.get(&name).await {
                    Ok(secret) => credentials_of(&secret).map(Arc::new),
                    Err(e) => Err(secret_problem(&e)),
                };
                ((ns, name), r)
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
    let mut findings = BTreeSet::new();
    let mut keyrings = Vec::with_capacity(containers.len());
    let mut secret_names = Vec::with_capacity(containers.len());
    for (c, names) in containers.iter().zip(names) {
        if c.pull.secrets.is_empty()
            && let Some(sa) = &c.pull.service_account
            && let Some(Err(problem)) = got_accounts.get(&(c.namespace.clone(), sa.clone()))
        {
            findings.insert(PullSecretFinding {
                workload: c.workload(),
                object: format!("serviceaccount {}/{sa}", c.namespace),
                problem: problem.clone(),
            });
        }
        let mut keyring = Vec::new();
        for name in &names {
            match got_secrets.get(&(c.namespace.clone(), name.clone())) {
                Some(Ok(creds)) => keyring.push((label(&c.namespace, name), creds.clone())),
                Some(Err(problem)) => {
                    findings.insert(PullSecretFinding {
                        workload: c.workload(),
                        object: format!("secret {}/{name}", c.namespace),
                        problem: problem.clone(),
                    });
                }
                None => {}
            }
        }
        keyrings.push(keyring);
        secret_names.push(
            names
                .iter()
                .map(|n| format!("{}/{n}", c.namespace))
                .collect(),
        );
    }
    Resolved {
        keyrings,
        secret_names,
        findings: findings.into_iter().collect(),
        gets: (got_accounts.len(), got_secrets.len()),
    }
}

fn account_problem(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => "not found: the API server creates no pod of \
             this workload until it exists (the ServiceAccount admission plugin refuses them)"
            .to_string(),
        kube::Error::Api(s) if s.code == 403 => format!(
            "cannot be read ({}): its imagePullSecrets are unknown, the images are read without \
             them (give get on serviceaccounts)",
            reason(e)
        ),
        _ => format!(
            "cannot be read ({}): its imagePullSecrets are unknown, the images are read without \
             them",
            reason(e)
        ),
    }
}

fn secret_problem(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 => {
            "not found: the kubelet pulls the images without it".to_string()
        }
        kube::Error::Api(s) if s.code == 403 => format!(
            "cannot be read ({}): the images are read without it (give get on secrets)",
            reason(e)
        ),
        _ => format!(
            "cannot be read ({}): the images are read without it",
            reason(e)
        ),
    }
}

/// The credentials of a pull secret, as the kubelet reads them: `.dockerconfigjson` of a
/// `kubernetes.io/dockerconfigjson` Secret, `.dockercfg` of a `kubernetes.io/dockercfg` one.
/// Another type, or the key absent or empty, is ignored by the kubelet (a finding here); a
/// key that does not parse makes the kubelet refuse every pull of the pod.
pub fn credentials_of(secret: &Secret) -> Result<Credentials, String> {
    let kind = secret.type_.as_deref().unwrap_or("Opaque");
    type Parse = fn(&str) -> Result<Credentials, String>;
    let (key, parse): (&str, Parse) = match kind {
        "kubernetes.io/dockerconfigjson" => (".dockerconfigjson", Credentials::parse),
        "kubernetes.io/dockercfg" => (".dockercfg", Credentials::parse_dockercfg),
        other => {
            return Err(format!(
                "of type {other}, not kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg: \
                 the kubelet ignores it"
            ));
        }
    };
    let data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .filter(|b| !b.0.is_empty())
        .ok_or_else(|| format!("has no {key}: the kubelet ignores it"))?;
    let malformed = |why: String| {
        format!(
            "malformed {key} ({why}): the kubelet refuses to pull any image of a pod that names \
             it; the images are read without it"
        )
    };
    let text = std::str::from_utf8(&data.0).map_err(|_| malformed("not UTF-8".to_string()))?;
    parse(text).map_err(malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(kind: &str, key: &str, text: &str) -> Secret {
        Secret {
            type_: Some(kind.to_string()),
            data: Some([(key.to_string(), ByteString(text.as_bytes().to_vec()))].into()),
            ..Secret::default()
        }
    }

    #[test]
    fn both_pull_secret_formats_are_read() {
        let c = credentials_of(&secret(
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            r#"{"auths":{"127.0.0.1:5000":{"auth":"dTpw"}}}"#,
        ))
        .unwrap();
        assert!(!c.is_empty());
        let c = credentials_of(&secret(
            "kubernetes.io/dockercfg",
            ".dockercfg",
            r#"{"127.0.0.1:5000":{"username":"u","password":"p"}}"#,
        ))
        .unwrap();
        assert!(!c.is_empty());
        let e = credentials_of(&secret(
            "kubernetes.io/dockerconfigjson",
            ".dockerconfigjson",
            r#"{"auths":{"r":{"auth":"s3cret-not-base64!"}}}"#,
        ))
        .unwrap_err();
        assert!(e.starts_with("malformed .dockerconfigjson"), "{e}");
        assert!(!e.contains("s3cret"), "{e}");
        let e = credentials_of(&secret("Opaque", ".dockerconfigjson", "{}")).unwrap_err();
        assert!(e.contains("of type Opaque"), "{e}");
        let e = credentials_of(&secret(
            "kubernetes.io/dockercfg",
            ".dockerconfigjson",
            "{}",
        ))
        .unwrap_err();
        assert!(e.contains("has no .dockercfg"), "{e}");
    }
}
