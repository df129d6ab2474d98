//! modelgate's core: docs/policy.md §1–§7 as bytes in → bytes out, with no I/O.
//!
//! The layers, from the inside out:
//! - [`config`]: the policy's settings (docs/policy.md §2) as plain values;
//! - [`patch`]: JSON patch operations addressed by field path;
//! - [`policy`]: the rules of docs/policy.md as pure functions over a decoded workload;
//! - [`cache`]: KServe's model cache objects, their conversion into index entries, and the index
//!   that answers lookups;
//! - [`kinds`]: the kinds handled and the workload-kind table (where each kind keeps its pod
//!   templates), read by `config` and `admission` alike;
//! - [`namespaces`]: each namespace's rollout mode and Pod Security level;
//! - [`backstop`]: the ValidatingAdmissionPolicy that holds the policy inside the API server;
//! - [`admission`]: the wire format — decodes an AdmissionReview, dispatches by kind and
//!   operation, shapes the policy's verdict by the namespace's mode, and encodes the one
//!   response the API server gets.
//!
//! The `modelgate` package around it reads files and flags, watches the cluster and serves TLS.
//! This crate depends on no async runtime, HTTP stack, Kubernetes client or argument parser;
//! `scripts/test.sh` checks that with `cargo tree`.

#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod admission;
pub mod backstop;
pub mod cache;
pub mod config;
pub mod exceptions;
mod keyed;
pub mod kinds;
pub mod namespaces;
mod patch;
pub mod policy;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
