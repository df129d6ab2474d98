//! modelgate: a mutating and validating admission webhook for clusters that serve ML models.
//!
//! The layers, from the inside out:
//! - [`policy`]: SPEC.md's rules as pure functions over a decoded workload;
//! - [`cache`]: KServe's model cache objects and the index that answers lookups;
//! - [`namespaces`]: each namespace's rollout mode and Pod Security level;
//! - [`admission`]: the wire format — decodes an AdmissionReview, dispatches by kind and
//!   operation, shapes the policy's verdict by the namespace's mode, and encodes the one
//!   response the API server gets;
//! - [`server`]: `serve`'s TLS listener, probes, metrics, certificate reload and shutdown;
//! - [`cli`]: the `review`, `serve` and `certs` commands.

pub mod admission;
pub mod audit;
pub mod cache;
pub mod cli;
pub mod config;
pub mod documents;
pub mod namespaces;
pub mod patch;
pub mod policy;
pub mod server;
