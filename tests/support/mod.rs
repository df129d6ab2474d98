//! Shared helpers of the integration tests.

pub mod fake_apiserver;
