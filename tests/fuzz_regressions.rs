//! The fuzz targets' checks, replayed deterministically on every test run: every kept corpus
//! input (`fuzz/corpus/<target>/`) and every regression input (`fuzz/regressions/<target>/`,
//! where crash artifacts are kept once fixed) goes through the same `fuzz/invariants.rs` the
//! cargo-fuzz targets call. Exploring for new inputs is `scripts/fuzz.sh`, a separate command.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

#[path = "../fuzz/invariants.rs"]
mod invariants;

fn inputs(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz").join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    files
}

/// Runs `check` on every input of the target's corpus and regressions; fails naming each input
/// that broke an invariant (all of them, not only the first).
fn replay(target: &str, check: fn(&[u8])) {
    let corpus = inputs(&format!("corpus/{target}"));
    let regressions = inputs(&format!("regressions/{target}"));
    assert!(!corpus.is_empty(), "fuzz/corpus/{target} is empty");
    assert!(
        !regressions.is_empty(),
        "fuzz/regressions/{target} is empty"
    );
    let mut failed = Vec::new();
    for path in corpus.iter().chain(&regressions) {
        let data = std::fs::read(path).unwrap();
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&data))) {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("{}: {why}", path.display()));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} inputs break the {target} invariants (reproduce one with \
         scripts/fuzz.sh reproduce {target} <file>):\n{}",
        failed.len(),
        corpus.len() + regressions.len(),
        failed.join("\n")
    );
}

#[test]
fn read_documents_corpus_and_regressions() {
    replay("read_documents", invariants::check_read_documents);
}

#[test]
fn review_corpus_and_regressions() {
    replay("review", invariants::check_review);
}
