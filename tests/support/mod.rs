//! Shared helpers of the integration tests. Each test file uses a part of them.
#![allow(dead_code)]

pub mod fake_apiserver;
