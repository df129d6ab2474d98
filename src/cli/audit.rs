//! `modelgate audit`: "what would change if I enforce?", answered for the workloads that exist,
//! from files or from the cluster (docs/policy.md §10). Exit codes as `review`: 0 every object would
//! be allowed, 1 at least one would be denied, 2 bad input, flags, or a cluster that could not
//! be read completely; under `--write-reports`, 0 once every report is written (1 for a denial
//! only with `--fail-on-findings`), 2 when a call was refused.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use serde_json::Value;

use super::{CacheFiles, EXIT_USAGE, LoadedFiles};
use crate::admission::Context;
use crate::audit::output::reports::{self, ReportApi, Timestamp};
use crate::audit::{self, Extracted, Report, cluster};
use crate::cache::list as cache_list;
use crate::cli::policy::PolicyArgs;
use crate::config::{AbsentClaims, PolicyConfig};
use crate::documents::for_each_document;
use crate::images::registry::Fetcher;
use crate::kinds::WorkloadKinds;
use crate::namespaces::{Mode, NamespaceDocuments, Namespaces, is_namespace};
use crate::policy::Caches;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuditOutput {
    /// Counts per namespace and per rule, then each denial.
    Table,
    /// The whole report as one JSON object.
    Json,
    /// A JUnit XML report: a suite per namespace, a case per object, a failure per denial.
    Junit,
    /// openreports.io/v1alpha1 Reports: a YAML stream, one per workload, a result per rule.
    #[value(name = "openreports")]
    OpenReports,
    /// wgpolicyk8s.io/v1alpha2 PolicyReports (the older API), same shape.
    #[value(name = "policyreport")]
    PolicyReport,
}

/// The report API `--write-reports` writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ReportApiArg {
    /// openreports.io/v1alpha1 Report.
    #[value(name = "openreports")]
    OpenReports,
    /// wgpolicyk8s.io/v1alpha2 PolicyReport.
    #[value(name = "policyreport")]
    PolicyReport,
}

impl From<ReportApiArg> for ReportApi {
    fn from(a: ReportApiArg) -> Self {
        match a {
            ReportApiArg::OpenReports => ReportApi::OpenReports,
            ReportApiArg::PolicyReport => ReportApi::PolicyReport,
        }
    }
}

#[derive(Args, Debug)]
#[command(
    after_help = "Exit codes:\n  0  no object would be denied; with --write-reports: every report \
written and the prune done, whatever the findings\n  1  at least one object would be denied \
(with --write-reports: only with --fail-on-findings)\n  2  bad input or flags, a cluster that \
could not be read completely (no report is written), or a report that --write-reports could \
not write"
)]
pub struct AuditArgs {
    /// Files or directories to audit (YAML or JSON, several documents or a List; `-` reads
    /// stdin; a directory's .yaml, .yml and .json files). Pods, Jobs and the kinds of the
    /// workload-kind table (Deployments, StatefulSets, DaemonSets, ReplicaSets,
    /// ReplicationControllers, CronJobs, the ML custom resources, --workload-kinds) are
    /// evaluated; Namespaces give their Pod Security labels; other objects are skipped.
    #[arg(value_name = "FILE|-")]
    pub inputs: Vec<PathBuf>,

    /// Audit the cluster of the current kubeconfig context instead, with list calls only: the
    /// workloads (of the kinds the cluster serves; one note names the others), the model
    /// caches, PVCs and Nodes, and the Namespaces' Pod Security labels (--caches objects and
    /// Namespaces replace the cluster's of the same kind and name).
    #[arg(long, env = "MODELGATE_FROM_CLUSTER")]
    pub from_cluster: bool,

    /// Only these namespaces (repeatable; default: all). With --from-cluster, each is listed
    /// on its own, so that list permission in these namespaces is enough.
    #[arg(
        long = "namespace",
        short = 'n',
        value_name = "NS",
        env = "MODELGATE_AUDIT_NAMESPACE",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,

    /// Objects per list call with --from-cluster (the API server's `limit`).
    #[arg(long, default_value_t = 500, env = "MODELGATE_PAGE_SIZE",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub page_size: u32,

    #[command(flatten)]
    pub caches: CacheFiles,

    #[arg(long, short = 'o', value_enum, default_value_t = AuditOutput::Table)]
    pub output: AuditOutput,

    /// With --from-cluster: also write a report per workload to the cluster (server-side
    /// apply, field manager `modelgate`, owned by its workload), then delete modelgate's
    /// reports (label app.kubernetes.io/managed-by=modelgate) whose workload was not audited
    /// this time. Needs create, patch, list and delete on the report resource. -o still
    /// chooses what is printed.
    #[arg(long, env = "MODELGATE_WRITE_REPORTS")]
    pub write_reports: bool,

    /// With --write-reports: exit 1 when an object would be denied, as without it. By default
    /// the findings are the reports' content, and the exit code says only whether the reports
    /// were written.
    #[arg(long, env = "MODELGATE_FAIL_ON_FINDINGS")]
    pub fail_on_findings: bool,

    /// The report API --write-reports writes.
    #[arg(long, value_enum, default_value_t = ReportApiArg::OpenReports,
          env = "MODELGATE_REPORT_API")]
    pub report_api: ReportApiArg,

    /// Also read each workload's images from their registries, as `modelgate images` does
    /// (with --from-cluster, with each workload's pull secrets), and add the `image-user`
    /// check to every output: warn when a container runs as a uid its image does not expect,
    /// error when an image cannot be read. It never changes the exit code. Without it, no
    /// registry is called and the registry flags are not used.
    #[arg(long, env = "MODELGATE_AUDIT_IMAGES")]
    pub images: bool,

    #[command(flatten)]
    pub registry: super::images::RegistryArgs,

    #[command(flatten)]
    pub policy: PolicyArgs,
}

pub fn run(args: AuditArgs) -> ExitCode {
    let findings_fail = !args.write_reports || args.fail_on_findings;
    match execute(args, &mut std::io::stdout().lock()) {
        Ok(Verdict {
            refused_writes: true,
            ..
        }) => ExitCode::from(EXIT_USAGE),
        Ok(Verdict {
            all_allowed: false, ..
        }) if findings_fail => ExitCode::from(1),
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// What the audit found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Every object would be allowed.
    pub all_allowed: bool,
    /// `--write-reports` could not write (or delete) at least one report.
    pub refused_writes: bool,
}

/// Audits, writes the report (and with `--write-reports`, the cluster's reports).
pub fn execute(mut args: AuditArgs, out: &mut dyn Write) -> anyhow::Result<Verdict> {
    // A namespace named twice is audited, listed and pruned once.
    let mut named = std::collections::HashSet::new();
    args.namespaces.retain(|ns| named.insert(ns.clone()));
    if args.from_cluster && !args.inputs.is_empty() {
        bail!("give files to audit or --from-cluster, not both");
    }
    if args.write_reports && !args.from_cluster {
        bail!(
            "--write-reports writes the reports of the cluster's workloads: it needs \
             --from-cluster (to see reports of files, use -o openreports or -o policyreport)"
        );
    }
    let mut config = args.policy.clone().into_config();
    // The table's rows are named by every evaluated object for the whole run (one per process).
    let table: &'static WorkloadKinds = Box::leak(Box::new(config.workload_kinds.as_ref().clone()));
    // "What would change if I enforce?": enforce everywhere, whatever the namespaces' labels.
    config.default_mode = Mode::Enforce;
    // Claims listed from the cluster are all there are; those of files may be a few.
    if args.from_cluster {
        config.absent_claims = AbsentClaims::Missing;
    }
    let LoadedFiles {
        index,
        namespaces,
        skipped,
    } = args.caches.load()?;
    super::note_skipped(&skipped);
    let keep = Keep {
        entries: args.output == AuditOutput::Junit,
        results: args.write_reports
            || matches!(
                args.output,
                AuditOutput::OpenReports | AuditOutput::PolicyReport
            ),
    };
    let at = Timestamp::of_run();
    let mut progress = Progress::new();
    // Only with --images is a registry called; its flags are checked before anything is read.
    let fetcher = if args.images {
        Some(args.registry.fetcher()?)
    } else {
        None
    };
    let (report, written) = if args.from_cluster {
        audit_cluster(
            &args,
            &config,
            table,
            index,
            namespaces,
            keep,
            at,
            fetcher.as_ref(),
            &mut progress,
        )?
    } else {
        let report = audit_files(
            &args,
            &config,
            table,
            index,
            namespaces,
            keep,
            fetcher.as_ref(),
            &mut progress,
        )?;
        (report, None)
    };
    progress.finish();
    let workloads = report.workloads.as_deref().unwrap_or_default();
    match args.output {
        AuditOutput::Table => out.write_all(report.table().as_bytes())?,
        AuditOutput::Json => report.write_json(out)?,
        AuditOutput::Junit => report.write_junit(out)?,
        AuditOutput::OpenReports => {
            reports::write_stream(out, ReportApi::OpenReports, workloads, at)?
        }
        AuditOutput::PolicyReport => {
            reports::write_stream(out, ReportApi::PolicyReport, workloads, at)?
        }
    }
    out.flush()?;
    let mut refused_writes = false;
    if let Some(written) = written {
        for line in &written.refused {
            eprintln!("error: cannot write {line}");
        }
        eprintln!("{}", written.summary());
        refused_writes = !written.refused.is_empty();
    }
    Ok(Verdict {
        all_allowed: report.all_allowed(),
        refused_writes,
    })
}

/// What the report keeps of every object beyond the counts.
#[derive(Clone, Copy, Debug)]
struct Keep {
    /// For JUnit.
    entries: bool,
    /// The results by rule, for the policy reports.
    results: bool,
}

impl Keep {
    fn report(self, source: &str) -> Report {
        let report = Report::new(source, self.entries);
        if self.results {
            report.keeping_results()
        } else {
            report
        }
    }
}

/// Counts what is not evaluated, for one note each at the end.
#[derive(Default)]
struct Skipped {
    owned: BTreeMap<&'static str, usize>,
    other_kinds: BTreeMap<String, usize>,
}

impl Skipped {
    fn notes(self) -> Vec<String> {
        let mut notes: Vec<String> = self
            .owned
            .into_iter()
            .map(|(what, n)| format!("{what}: {n}, counted through the owner's template"))
            .collect();
        if !self.other_kinds.is_empty() {
            let kinds: Vec<String> = self
                .other_kinds
                .iter()
                .map(|(k, n)| format!("{k} ({n})"))
                .collect();
            notes.push(format!("not workloads, skipped: {}", kinds.join(", ")));
        }
        notes
    }
}

/// Everything one object needs to be counted.
struct Auditor<'a> {
    ctx: Context<'a>,
    table: &'static WorkloadKinds,
    config: &'a PolicyConfig,
    only: &'a [String],
    report: Report,
    skipped: Skipped,
    /// With `--images`: the containers of every evaluated object, with the uid each gets.
    containers: Option<Vec<crate::images::ContainerUse>>,
}

impl Auditor<'_> {
    fn audit(&mut self, value: Value, origin: &str) -> Result<(), String> {
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("(no kind)")
            .to_string();
        let copy = self.containers.is_some().then(|| value.clone());
        match audit::extract(value, "default", self.table)? {
            Extracted::Target(t) => {
                if !self.only.is_empty() && !self.only.contains(&t.namespace) {
                    return Ok(());
                }
                if self.config.is_exempt(&t.namespace) {
                    self.report.add_exempt(&t.namespace);
                    return Ok(());
                }
                if let (Some(containers), Some(copy)) = (self.containers.as_mut(), copy) {
                    containers.extend(crate::images::containers_of(copy, self.table, &self.ctx)?);
                }
                let e = audit::evaluate(&t, &self.ctx);
                self.report.add(&t, origin, e);
            }
            Extracted::Owned(why) => *self.skipped.owned.entry(why).or_default() += 1,
            Extracted::NotAWorkload => *self.skipped.other_kinds.entry(kind).or_default() += 1,
        }
        Ok(())
    }

    fn finish(mut self) -> (Report, Option<Vec<crate::images::ContainerUse>>) {
        self.report.notes.extend(self.skipped.notes());
        if let (Some(now), Caches::Ready(index) | Caches::NotSynced(index)) =
            (self.ctx.now, self.ctx.caches)
        {
            self.report.exceptions.describe(
                index,
                self.ctx.namespaces,
                now,
                self.config.max_exception_days,
            );
        }
        (self.report, self.containers)
    }
}

#[allow(clippy::too_many_arguments)]
fn audit_files(
    args: &AuditArgs,
    config: &PolicyConfig,
    table: &'static WorkloadKinds,
    index: crate::cache::CacheIndex,
    file_namespaces: NamespaceDocuments,
    keep: Keep,
    fetcher: Option<&Fetcher>,
    progress: &mut Progress,
) -> anyhow::Result<Report> {
    let mut namespaces = file_namespaces.over(Namespaces::default());
    let inputs = if args.inputs.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        args.inputs.clone()
    };
    let mut texts = Vec::new();
    for path in expand_directories(&inputs)? {
        let (origin, text) = super::read_input(&path)?;
        texts.push((origin, text));
    }
    // First the Namespaces (their Pod Security labels decide the prep), wherever they are in
    // the stream: only documents that mention `Namespace` are parsed for that.
    let mut namespace_docs = Vec::new();
    for (origin, text) in &texts {
        for_each_document(origin, text, Some("Namespace"), |d| {
            if is_namespace(&d.value) {
                namespace_docs.push(d);
            }
            Ok::<_, anyhow::Error>(())
        })?;
    }
    crate::namespaces::insert_documents(&mut namespaces, &namespace_docs)?;
    let namespaces = namespaces.without_modes();
    let mut auditor = Auditor {
        ctx: Context {
            config,
            caches: Caches::Ready(&index),
            namespaces: &namespaces,
            now: Some(crate::unix_now()),
        },
        table,
        config,
        only: &args.namespaces,
        report: keep.report("files"),
        skipped: Skipped::default(),
        containers: fetcher.is_some().then(Vec::new),
    };
    // Then every object, evaluated as soon as its document is read and dropped after.
    let mut seen = 0;
    for (origin, text) in &texts {
        for_each_document(origin, text, None, |doc| {
            seen += 1;
            progress.show(&format!("evaluated {seen} objects"));
            auditor
                .audit(doc.value, &doc.origin)
                .map_err(|why| anyhow::anyhow!("{}: {why}", doc.origin))
        })?;
    }
    let (mut report, containers) = auditor.finish();
    if let (Some(fetcher), Some(containers)) = (fetcher, containers) {
        progress.show("reading images");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        let read = runtime.block_on(crate::images::read_images(fetcher, containers, None, None));
        audit::images::join(&mut report, read);
    }
    Ok(report)
}

/// A directory stands for its `.yaml`, `.yml` and `.json` files, in name order, as
/// `kubectl apply -f DIR` reads them (not recursively).
pub(crate) fn expand_directories(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for path in inputs {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("{}: cannot read the directory", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.is_file()
                    && p.extension()
                        .is_some_and(|x| x == "yaml" || x == "yml" || x == "json")
            })
            .collect();
        files.sort();
        out.extend(files);
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn audit_cluster(
    args: &AuditArgs,
    config: &PolicyConfig,
    table: &'static WorkloadKinds,
    index: crate::cache::CacheIndex,
    file_namespaces: NamespaceDocuments,
    keep: Keep,
    at: Timestamp,
    fetcher: Option<&Fetcher>,
    progress: &mut Progress,
) -> anyhow::Result<(Report, Option<audit::write::Written>)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(cluster::ListError::Runtime)?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(cluster::ListError::Client)?;
        let mut notes = Vec::new();
        // The model caches, as `serve` would see them, so that routing is judged as enforce's.
        let listed = cache_list::list_once(client.clone(), &index).await?;
        notes.extend(listed.notes.iter().map(|n| format!("caches: {n}")));
        // The Namespaces' Pod Security labels (metadata only, as `serve` reads them), with the
        // files' Namespaces in place of the cluster's of the same name.
        let namespaces = match crate::namespaces::list::list_once(&client, args.page_size).await {
            Ok(cluster) => file_namespaces.over(cluster),
            // Reports are the cluster's record: written from a partial view, every workload of
            // a restricted namespace would read as getting a root prep (docs/policy.md §10: a failed
            // call is exit 2, before anything is written).
            Err(e) if args.write_reports => {
                anyhow::bail!(
                    "cannot list namespaces ({}): their Pod Security labels decide the reports' \
                     content; no report is written or deleted",
                    cluster::reason(&e)
                );
            }
            Err(e) => {
                notes.push(format!(
                    "cannot list namespaces ({}): their Pod Security labels are unknown, so \
                     no namespace is treated as restricted unless --caches files say so",
                    cluster::reason(&e)
                ));
                file_namespaces.over(Namespaces::default())
            }
        };
        let namespaces = namespaces.without_modes();
        let mut auditor = Auditor {
            ctx: Context {
                config,
                caches: Caches::Ready(&listed.index),
                namespaces: &namespaces,
                now: Some(crate::unix_now()),
            },
            table,
            config,
            only: &args.namespaces,
            report: keep.report("cluster"),
            skipped: Skipped::default(),
            containers: fetcher.is_some().then(Vec::new),
        };
        let mut failed = None;
        let not_served = cluster::list_workloads(
            &client,
            table,
            &args.namespaces,
            args.page_size,
            |kind, objects| {
                for object in objects {
                    let name = object
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string();
                    if let Err(why) = auditor.audit(object, "cluster") {
                        failed.get_or_insert(format!("{} {name}: {why}", kind.as_str()));
                    }
                }
                progress.show(&format!(
                    "evaluated {} objects (listing {})",
                    auditor.report.objects,
                    kind.plural()
                ));
            },
        )
        .await?;
        if let Some(why) = failed {
            bail!("{why}");
        }
        let (mut report, containers) = auditor.finish();
        report.notes.extend(notes);
        // Before any report is written: the reports carry the `image-user` results.
        if let (Some(fetcher), Some(containers)) = (fetcher, containers) {
            progress.show("reading pull secrets and images");
            let pull = crate::images::pull::resolve(&client, &containers).await;
            let read = crate::images::read_images(fetcher, containers, Some(pull), None).await;
            audit::images::join(&mut report, read);
        }
        if !not_served.is_empty() {
            report.notes.push(format!(
                "kinds this cluster does not serve, skipped: {}",
                not_served.join(", ")
            ));
        }
        // Only here, after every list succeeded: a prune after an incomplete listing would
        // delete the reports of workloads that were merely not read.
        let written = if args.write_reports {
            progress.show("writing reports");
            Some(
                audit::write::write_reports(
                    &client,
                    args.report_api.into(),
                    report.workloads.as_deref().unwrap_or_default(),
                    &args.namespaces,
                    args.page_size,
                    at,
                )
                .await,
            )
        } else {
            None
        };
        Ok((report, written))
    })
}

/// A progress line on stderr, only when stderr is a terminal (never in a pipe or a CI log),
/// redrawn at most ten times a second and erased at the end.
struct Progress {
    enabled: bool,
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    fn new() -> Self {
        Progress {
            enabled: std::io::stderr().is_terminal(),
            last: None,
            shown: false,
        }
    }

    fn show(&mut self, line: &str) {
        if !self.enabled
            || self
                .last
                .is_some_and(|t| t.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        self.last = Some(Instant::now());
        self.shown = true;
        eprint!("\r\x1b[Kaudit: {line}");
    }

    fn finish(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
            self.shown = false;
        }
    }
}
