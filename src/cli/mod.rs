//! The command line: `modelgate review`, `modelgate serve`, `modelgate certs`, `modelgate
//! backstop`.
//!
//! Invalid flags end the program with exit code 2 and a one-line error, before anything runs.

pub mod audit;
pub mod backstop;
pub mod certs;
pub mod images;
pub mod policy;
pub mod review;
pub mod serve;

use std::process::ExitCode;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use crate::cache::CacheIndex;
use crate::documents::read_documents;
use crate::namespaces::NamespaceDocuments;

#[derive(Parser, Debug)]
#[command(
    name = "modelgate",
    // The crate version and the commit it was built from (build.rs).
    version = env!("MODELGATE_BUILD_VERSION"),
    about = "Admission webhook for clusters that serve ML models"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per run: the size of the largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the admission pipeline offline on manifests or AdmissionReviews (a dry run).
    Review(review::ReviewArgs),
    /// Evaluate existing workloads (files or the cluster) as if created now in enforce mode:
    /// counts per namespace and per rule, and each denial.
    Audit(Box<audit::AuditArgs>),
    /// Serve the webhooks over TLS (`--dev`: with a generated certificate, for trying it out).
    Serve(Box<serve::ServeArgs>),
    /// Read each workload image's OCI config from its registry: the User it declares next to
    /// the uid modelgate's mutation gives the container (`--expect-user`: the image contract).
    Images(Box<images::ImagesArgs>),
    /// Write a CA and a serving certificate for the webhook Service; print the caBundle.
    Certs(certs::CertsArgs),
    /// Print the ValidatingAdmissionPolicy and binding that hold the policy inside the API
    /// server while the webhook does not answer (for `kubectl apply -f -`).
    Backstop(Box<backstop::BackstopArgs>),
}

/// `--caches FILE`, shared by `review`, `audit` and `serve`.
#[derive(Args, Clone, Debug, Default)]
pub struct CacheFiles {
    /// The cluster state to resolve against (LocalModelCache, LocalModelNamespaceCache with their
    /// status, LocalModelNodeGroup, PersistentVolumeClaim, Node) and Namespaces (their
    /// modelgate.io/mode and Pod Security labels): YAML or JSON, several documents or a List;
    /// repeatable. Without the cluster, files are the whole truth: a hit needs the PVC, the
    /// cache's status and the Nodes in them; with it, a file's cache object (and, with
    /// --from-cluster, Namespace) replaces the cluster's of the same kind, namespace and name.
    #[arg(
        long = "caches",
        value_name = "FILE",
        env = "MODELGATE_CACHES",
        value_delimiter = ','
    )]
    pub files: Vec<PathBuf>,
}

/// What `--caches` files hold.
pub struct LoadedFiles {
    pub index: CacheIndex,
    /// The files' Namespaces (`review` and `audit --from-cluster` put them in place of the
    /// cluster's of the same name).
    pub namespaces: NamespaceDocuments,
    /// Origins of the documents that are neither cache objects nor Namespaces.
    pub skipped: Vec<String>,
}

/// An input file, or standard input for `-`: its name for messages and its text, decoded as
/// kubectl decodes files ([`crate::documents::decode_text`]).
pub fn read_input(path: &std::path::Path) -> anyhow::Result<(String, String)> {
    let (origin, bytes) = if path.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
            .context("stdin: cannot read")?;
        ("stdin".to_string(), bytes)
    } else {
        let bytes =
            std::fs::read(path).with_context(|| format!("{}: cannot read", path.display()))?;
        (path.display().to_string(), bytes)
    };
    let text = crate::documents::decode_text(bytes)
        .map_err(|e| anyhow::anyhow!("{origin}: cannot read: {e}"))?;
    Ok((origin, text))
}

impl CacheFiles {
    /// Reads every file once: cache objects into the index, and the Namespaces.
    /// A cache object or Namespace that does not decode is an error naming its file and document.
    pub fn load(&self) -> anyhow::Result<LoadedFiles> {
        let mut index = CacheIndex::new();
        let mut namespaces = NamespaceDocuments::default();
        let mut skipped = Vec::new();
        for p in &self.files {
            let (_, text) = read_input(p)?;
            let docs = read_documents(&p.display().to_string(), &text)?;
            namespaces.read(&docs)?;
            let not_caches = crate::cache::insert_documents(&mut index, &docs)?;
            skipped.extend(
                not_caches
                    .into_iter()
                    .filter(|s| !s.ends_with(" (Namespace)")),
            );
        }
        Ok(LoadedFiles {
            index,
            namespaces,
            skipped,
        })
    }
}

/// Tells the user, on stderr, which `--caches` documents were neither cache objects nor
/// Namespaces (`review` and `audit`; `serve` logs the same through tracing).
fn note_skipped(skipped: &[String]) {
    if !skipped.is_empty() {
        eprintln!(
            "note: --caches: skipped {} documents that are not cache objects or Namespaces: {}",
            skipped.len(),
            skipped.join(", ")
        );
    }
}

/// Exit code for bad input or flags.
pub const EXIT_USAGE: u8 = 2;

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind::{
                DisplayHelp, DisplayHelpOnMissingArgumentOrSubcommand, DisplayVersion,
            };
            if matches!(e.kind(), DisplayHelp | DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(EXIT_USAGE);
            }
            // One line: clap's first line names the flag, the value and why it was refused.
            let text = e.render().to_string();
            eprintln!(
                "{}",
                text.lines().next().unwrap_or("error: invalid arguments")
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match cli.command {
        Command::Review(args) => review::run(args),
        Command::Audit(args) => audit::run(*args),
        Command::Serve(args) => serve::run(*args),
        Command::Images(args) => images::run(*args),
        Command::Certs(args) => certs::run(args),
        Command::Backstop(args) => backstop::run(*args),
    }
}
