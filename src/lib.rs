//! modelgate: a mutating and validating admission webhook for clusters that serve ML models.
//!
//! # Layout
//! Two crates in one workspace. The pure pipeline, docs/policy.md §1–§7 as bytes in → bytes out, is
//! `crates/modelgate-core` ([`modelgate_core`]): [`admission`] (decode, dispatch, modes,
//! encode), [`policy`], [`patch`], [`config`] (the policy's settings as plain values), the cache
//! index and the conversion of cluster objects into it, and the namespaces' modes. It has no
//! I/O and no async runtime, HTTP stack, Kubernetes client or argument parser among its
//! dependencies, so this package depends on it and never the other way round.
//!
//! This package adds what touches the world:
//! - [`cache`]: the core's index, filled from `--caches` files, a one-time list of the cluster
//!   and `serve`'s watch, with its metrics;
//! - [`namespaces`]: the core's namespace modes, from files and `serve`'s metadata watch;
//! - [`documents`]: YAML and JSON files read as kubectl reads them (docs/policy.md §8);
//! - [`duration`]: durations as Kubernetes writes them (`10s`, `1m30s`), for flags and queries;
//! - [`junit`]: the JUnit XML format that `review` and `audit` write;
//! - [`audit`]: `modelgate audit`'s evaluation of existing workloads (docs/policy.md §10);
//! - [`images`]: `modelgate images`, each workload image's OCI config read from its registry
//!   (never on the admission path);
//! - [`server`]: `serve`'s TLS listener, probes, metrics, certificate reload and shutdown;
//! - [`cli`]: the commands and their flags (the policy flags convert into the core's config).

pub use modelgate_core::{admission, backstop, config, exceptions, kinds, policy};

/// The clock of the decisions that read exceptions' `expires` (docs/exceptions.md): Unix
/// seconds now.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

pub mod audit;
pub mod cache;
pub mod cli;
pub mod documents;
pub mod duration;
pub mod images;
pub mod junit;
pub mod namespaces;
mod reflector;
pub mod server;
