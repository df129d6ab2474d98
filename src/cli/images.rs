//! `modelgate images`: what each image of the workloads expects to run as, read from its OCI
//! config through the registry API, next to the uid modelgate's mutation gives each container
//! (docs/images.md). The admission path never calls a registry; this command does.
//!
//! Exit codes: 0 the images were read (warnings do not count); with `--expect-user`, 1 when a
//! readable image does not declare exactly that user, 2 when one could not be read; 2 for bad
//! input or flags, or a cluster (`--from-cluster`) that could not be listed completely.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use super::EXIT_USAGE;
use crate::admission::Context;
use crate::audit::cluster;
use crate::cli::policy::PolicyArgs;
use crate::documents::for_each_document;
use crate::duration::parse_duration;
use crate::images::registry::{Credentials, Fetcher, Platform, Settings};
use crate::images::{self, ExpectUser, Report};
use crate::kinds::WorkloadKinds;
use crate::namespaces::{Mode, Namespaces};
use crate::policy::Caches;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ImagesOutput {
    /// The images with their User, then the containers with the uid they run as, then the
    /// findings.
    Table,
    /// The whole report as one JSON object.
    Json,
    /// A JUnit XML report: a case per image (a failure when unreadable or not the expected
    /// user), a case per container (a failure per warning).
    Junit,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Exit codes:\n  0  every image was read (warnings do not change the exit code); \
without --expect-user, also when some could not be read (each is a finding)\n  1  with \
--expect-user: an image does not declare exactly that user\n  2  bad input or flags, or a \
cluster that could not be listed completely; with --expect-user: an image whose config could \
not be read"
)]
pub struct ImagesArgs {
    /// Files or directories of workloads (YAML or JSON, several documents or a List; `-` reads
    /// stdin; a directory's .yaml, .yml and .json files): Pods, Jobs and the kinds of the
    /// workload-kind table, as `audit` reads them; other objects are skipped.
    #[arg(value_name = "FILE|-")]
    pub inputs: Vec<PathBuf>,

    /// Read the workloads of the cluster of the current kubeconfig context instead, with list
    /// calls only (as `audit --from-cluster`), and each image with the pull credentials of the
    /// workload that runs it (its imagePullSecrets, else its ServiceAccount's: get on secrets
    /// and serviceaccounts), then --registry-config's.
    #[arg(long, env = "MODELGATE_FROM_CLUSTER")]
    pub from_cluster: bool,

    #[command(flatten)]
    pub registry: RegistryArgs,

    /// The image contract for CI: every image must declare exactly this numeric user (`1000`
    /// or `1000:1000`): exit 1 when one does not, 2 when one cannot be read.
    #[arg(long, value_name = "UID[:GID]", env = "MODELGATE_EXPECT_USER")]
    pub expect_user: Option<ExpectUser>,

    #[arg(long, short = 'o', value_enum, default_value_t = ImagesOutput::Table,
          env = "MODELGATE_IMAGES_OUTPUT")]
    pub output: ImagesOutput,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

/// How the registries are reached: shared by `images` and `audit --images`.
#[derive(Args, Clone, Debug)]
pub struct RegistryArgs {
    /// Which manifest of a multi-platform image is read: OS/ARCH or OS/ARCH/VARIANT. Default:
    /// linux and the architecture of this machine.
    #[arg(long, value_name = "OS/ARCH[/VARIANT]", env = "MODELGATE_PLATFORM")]
    pub platform: Option<Platform>,

    /// A docker config.json whose `auths` give the user and password of each registry
    /// (default: every registry is read anonymously). Each entry is used for its registry
    /// only (and the token service that registry's challenge names); with --from-cluster,
    /// after the workload's pull secrets.
    #[arg(long, value_name = "FILE", env = "MODELGATE_REGISTRY_CONFIG")]
    pub registry_config: Option<PathBuf>,

    /// A registry reached over plain HTTP instead of HTTPS, as HOST:PORT (repeatable); every
    /// other registry is reached over HTTPS.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "MODELGATE_INSECURE_REGISTRY",
        value_delimiter = ','
    )]
    pub insecure_registry: Vec<String>,

    /// A PEM file of CA certificates trusted for the registries, besides the system's roots
    /// (repeatable).
    #[arg(
        long,
        value_name = "FILE",
        env = "MODELGATE_REGISTRY_CA",
        value_delimiter = ','
    )]
    pub registry_ca: Vec<PathBuf>,

    /// How long one image may take to read (manifest, index and config together); a registry
    /// that does not answer in time is a finding for that image.
    #[arg(long, value_name = "DURATION", default_value = "30s", env = "MODELGATE_IMAGE_TIMEOUT",
          value_parser = parse_positive_duration)]
    pub image_timeout: Duration,

    /// How many images are read at once from one registry (the registries are read side by
    /// side).
    #[arg(long, value_name = "N", default_value_t = 8, env = "MODELGATE_IMAGE_CONCURRENCY",
          value_parser = clap::value_parser!(u16).range(1..=64))]
    pub image_concurrency: u16,
}

fn parse_positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("must be more than 0".to_string()),
        d => Ok(d),
    }
}

pub fn run(args: ImagesArgs) -> ExitCode {
    let expect = args.expect_user.is_some();
    match execute(args, &mut std::io::stdout().lock()) {
        Ok(report) if expect && report.unreadable() => ExitCode::from(EXIT_USAGE),
        Ok(report) if expect && report.contract_broken() => ExitCode::from(1),
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

impl RegistryArgs {
    /// The fetcher these flags describe: every file read, every value checked, before any
    /// registry is called.
    pub fn fetcher(&self) -> anyhow::Result<Fetcher> {
        let credentials = match &self.registry_config {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| {
                    format!("--registry-config {}: cannot read", path.display())
                })?;
                Credentials::parse(&text)
                    .map_err(|e| anyhow::anyhow!("--registry-config {}: {e}", path.display()))?
            }
            None => Credentials::default(),
        };
        let mut ca_pem = Vec::new();
        for path in &self.registry_ca {
            let pem = std::fs::read(path)
                .with_context(|| format!("--registry-ca {}: cannot read", path.display()))?;
            if !pem.windows(11).any(|w| w == b"-----BEGIN ") {
                anyhow::bail!("--registry-ca {}: not a PEM file", path.display());
            }
            ca_pem.push(pem);
        }
        for host in &self.insecure_registry {
            if host.is_empty() || host.contains('/') {
                anyhow::bail!("--insecure-registry {host:?}: expected HOST:PORT (or HOST)");
            }
        }
        let settings = Settings {
            platform: self.platform.clone().unwrap_or_else(Platform::host),
            credentials,
            insecure: self.insecure_registry.clone(),
            ca_pem,
            timeout: self.image_timeout,
            concurrency: usize::from(self.image_concurrency),
        };
        Fetcher::new(settings).map_err(|e| anyhow::anyhow!(e))
    }
}

/// Reads the workloads and their images, writes the report; the report for the exit code.
pub fn execute(args: ImagesArgs, out: &mut dyn Write) -> anyhow::Result<Report> {
    // Everything that can be refused is read before any registry is called.
    let fetcher = args.registry.fetcher()?;

    let mut config = args.policy.clone().into_config();
    let table: &'static WorkloadKinds = Box::leak(Box::new(config.workload_kinds.as_ref().clone()));
    // The uid each container gets is what enforce would set, whatever the namespaces' labels.
    config.default_mode = Mode::Enforce;
    let index = crate::cache::CacheIndex::new();
    let namespaces = Namespaces::default();
    let ctx = Context {
        config: &config,
        caches: Caches::Ready(&index),
        namespaces: &namespaces,
        // Exceptions in force now apply, as at admission.
        now: Some(crate::unix_now()),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let mut containers = Vec::new();
    let mut notes = Vec::new();
    let mut pull = None;
    if args.from_cluster {
        if !args.inputs.is_empty() {
            anyhow::bail!("give files or --from-cluster, not both");
        }
        runtime.block_on(async {
            let client = kube::Client::try_default()
                .await
                .map_err(cluster::ListError::Client)?;
            let mut failed = None;
            let not_served = cluster::list_workloads(&client, table, &[], 500, |kind, objects| {
                for object in objects {
                    let name = object
                        .pointer("/metadata/name")
                        .and_then(serde_json::Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    match images::containers_of(object, table, &ctx) {
                        Ok(found) => containers.extend(found),
                        Err(why) => {
                            failed.get_or_insert(format!("{} {name}: {why}", kind.as_str()));
                        }
                    }
                }
            })
            .await?;
            if let Some(why) = failed {
                anyhow::bail!("{why}");
            }
            if !not_served.is_empty() {
                notes.push(format!(
                    "kinds this cluster does not serve, skipped: {}",
                    not_served.join(", ")
                ));
            }
            pull = Some(images::pull::resolve(&client, &containers).await);
            Ok::<_, anyhow::Error>(())
        })?;
    } else {
        let inputs = if args.inputs.is_empty() {
            vec![PathBuf::from("-")]
        } else {
            args.inputs.clone()
        };
        for path in super::audit::expand_directories(&inputs)? {
            let (origin, text) = super::read_input(&path)?;
            for_each_document(&origin, &text, None, |doc| {
                let found = images::containers_of(doc.value, table, &ctx)
                    .map_err(|why| anyhow::anyhow!("{}: {why}", doc.origin))?;
                containers.extend(found);
                Ok::<_, anyhow::Error>(())
            })?;
        }
    }
    let mut report = runtime.block_on(images::read_images(
        &fetcher,
        containers,
        pull,
        args.expect_user,
    ));
    report.notes.extend(notes);
    if report.images.is_empty() {
        report
            .notes
            .push("no workload with a container image in the input".to_string());
    }
    match args.output {
        ImagesOutput::Table => out.write_all(report.table().as_bytes())?,
        ImagesOutput::Json => report.write_json(out)?,
        ImagesOutput::Junit => report.write_junit(out)?,
    }
    out.flush()?;
    Ok(report)
}
