//! The request-bytes-to-response entry point for both webhooks; the checks are
//! `invariants::check_review`, which `tests/fuzz_regressions.rs` also runs on the kept inputs.
#![no_main]

#[path = "../invariants.rs"]
#[allow(dead_code)] // each target calls one of the checks
mod invariants;

libfuzzer_sys::fuzz_target!(|data: &[u8]| invariants::check_review(data));
