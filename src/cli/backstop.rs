//! `modelgate backstop`: prints the ValidatingAdmissionPolicy and its binding that hold the
//! policy inside the API server while the webhook does not answer (docs/policy.md §13), as a YAML
//! stream for `kubectl apply -f -`.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, CommandFactory as _, FromArgMatches as _, Parser};

use crate::backstop::{self, Selection};
use crate::cli::policy::PolicyArgs;

/// Prints the in-API-server policy (ValidatingAdmissionPolicy) and its binding.
///
/// The policy denies, inside the API server, what the validating webhook denies of security
/// fields: a runAsUser outside 1..2147483647, a runAsGroup or fsGroup outside 0..2147483647,
/// and a container other than modelgate's canonical model-cache-prep whose runAsNonRoot (its
/// own, else the pod's) is not true; on the templates of workload controllers, the ranges
/// only. It neither injects the prep container nor routes a model: while the webhook is down,
/// compliant pods are created without them, and the others are refused with a message that
/// names the field and says the backstop answered. Its binding selects the opted-in namespaces
/// in enforce mode (the modelgate.io/mode label, else --default-mode). Give it the policy flags
/// the webhook runs with.
#[derive(Args, Debug)]
#[command(
    after_help = "Example: modelgate backstop --namespace modelgate-system | kubectl apply -f -\n\
                        With the backstop installed the webhooks can run with failurePolicy: Ignore \
                        (docs/operations.md)."
)]
pub struct BackstopArgs {
    /// Name of the ValidatingAdmissionPolicy and of its binding.
    #[arg(long, env = "MODELGATE_BACKSTOP_NAME", default_value = backstop::DEFAULT_NAME)]
    pub name: String,

    /// The namespace modelgate runs in: exempt by default (with kube-system), and the namespace
    /// of its service account, whose own requests are never judged.
    #[arg(long, env = "POD_NAMESPACE", default_value = "modelgate-system")]
    pub namespace: String,

    /// modelgate's service account (requests it makes are never judged, as by the webhooks).
    #[arg(long, env = "MODELGATE_SERVICE_ACCOUNT", default_value = "modelgate")]
    pub service_account: String,

    /// A label KEY=VALUE a namespace must carry to be judged, as the webhooks'
    /// namespaceSelector (repeatable).
    #[arg(long = "opt-in-label", value_name = "KEY=VALUE", value_parser = parse_label,
          default_value = "modelgate.io/inject=enabled", env = "MODELGATE_OPT_IN_LABEL",
          value_delimiter = ',')]
    pub opt_in_labels: Vec<(String, String)>,

    /// Pods and templates of this priority class are never judged, as the webhooks'
    /// matchConditions leave them out (repeatable).
    #[arg(
        long = "exclude-priority-class",
        value_name = "CLASS",
        env = "MODELGATE_EXCLUDE_PRIORITY_CLASS",
        value_delimiter = ','
    )]
    pub exclude_priority_classes: Vec<String>,

    /// A file of the policy flags the previous release ran with (as the webhook takes them,
    /// one or more per line, `#` comments): during the rollout of an upgrade the policy accepts
    /// the prep container canonical under either settings, so that replicas of the previous
    /// release still answering get no pod refused. Without it the previous settings are these.
    #[arg(long, value_name = "FILE", env = "MODELGATE_BACKSTOP_PREVIOUS_VALUES")]
    pub previous_values: Option<PathBuf>,

    /// Also print, after the ValidatingAdmissionPolicy and its binding, the
    /// MutatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1, Kubernetes
    /// 1.36): on Pod and Job CREATE, in the namespaces the policy is bound to, it sets what
    /// /mutate sets of non-root (runAsNonRoot, and runAsUser/runAsGroup where /mutate would set
    /// them) and records it in the annotation modelgate.io/set-by-policy. Refused (exit 2) with
    /// --previous-values whose non-root settings differ from these.
    #[arg(long)]
    pub mutating: bool,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// The policy flags alone, for `--previous-values`.
#[derive(Parser, Debug)]
#[command(name = "--previous-values", no_binary_name = true)]
struct PreviousPolicy {
    #[command(flatten)]
    policy: PolicyArgs,
}

/// The settings of `--previous-values FILE`: its flags parsed as the webhook parses them, with
/// no environment variable read (those are this release's).
fn previous_settings(path: &Path) -> anyhow::Result<crate::config::PolicyConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--previous-values {}: cannot read it", path.display()))?;
    let words: Vec<&str> = text
        .lines()
        .map(|line| line.split_once('#').map_or(line, |(before, _)| before))
        .flat_map(str::split_whitespace)
        .collect();
    let command = PreviousPolicy::command().mut_args(|a| a.env(None));
    let matches = command.try_get_matches_from(words).map_err(|e| {
        let rendered = e.render().to_string();
        let first = rendered.lines().next().unwrap_or_default();
        let first = first.strip_prefix("error: ").unwrap_or(first);
        anyhow::anyhow!("--previous-values {}: {first}", path.display())
    })?;
    let previous = PreviousPolicy::from_arg_matches(&matches)
        .map_err(|e| anyhow::anyhow!("--previous-values {}: {e}", path.display()))?;
    Ok(previous.policy.into_config())
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

impl BackstopArgs {
    /// The policy settings and the namespace selection the objects are generated from.
    pub fn into_parts(mut self) -> (crate::config::PolicyConfig, Selection) {
        if self.policy.exempt_namespaces.is_empty() {
            self.policy.exempt_namespaces = vec!["kube-system".to_string()];
            if self.namespace != "kube-system" {
                self.policy.exempt_namespaces.push(self.namespace.clone());
            }
        }
        let mut selection = Selection::new(&self.namespace, &self.service_account);
        selection.name = self.name;
        selection.match_labels = self.opt_in_labels.into_iter().collect::<BTreeMap<_, _>>();
        selection.exclude_priority_classes = self.exclude_priority_classes;
        (self.policy.into_config(), selection)
    }
}

/// Why `backstop` prints nothing: a usage error (exit 2) or another failure (exit 1).
#[derive(Debug)]
pub enum RenderError {
    /// The flags ask for a MutatingAdmissionPolicy that would not agree with /mutate.
    Usage(backstop::mutating::MutatingError),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for RenderError {
    fn from(e: anyhow::Error) -> Self {
        RenderError::Other(e)
    }
}

/// The objects as a YAML stream, one document each.
pub fn render(args: BackstopArgs) -> anyhow::Result<String> {
    render_objects(args).map_err(|e| match e {
        RenderError::Usage(e) => anyhow::Error::new(e),
        RenderError::Other(e) => e,
    })
}

fn render_objects(args: BackstopArgs) -> Result<String, RenderError> {
    let previous = args.previous_values.clone();
    let mutating = args.mutating;
    let (cfg, selection) = args.into_parts();
    let previous = match previous {
        Some(path) => {
            let mut previous = previous_settings(&path)?;
            // The exemptions are resolved as for this release.
            previous.exempt_namespaces = cfg.exempt_namespaces.clone();
            previous
        }
        None => cfg.clone(),
    };
    let mut objects = backstop::objects_across_upgrade(&cfg, &previous, &selection)
        .map_err(anyhow::Error::new)?
        .to_vec();
    if mutating {
        objects.extend(
            backstop::mutating::objects_across_upgrade(&cfg, &previous, &selection)
                .map_err(RenderError::Usage)?,
        );
    }
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&object).map_err(anyhow::Error::new)?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

pub fn run(args: BackstopArgs) -> ExitCode {
    match render_objects(args) {
        Ok(text) => {
            let mut stdout = std::io::stdout().lock();
            match stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush())
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: cannot write the objects: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Err(RenderError::Usage(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(RenderError::Other(e)) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
