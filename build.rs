//! Stamps the binary with the commit it was built from, for `modelgate --version`:
//! `modelgate 0.1.0 (commit 1a2b3c4d5e6f, 2026-12-06)`, the date being the commit's.
//!
//! The commit is `MODELGATE_COMMIT` when set (and its date `MODELGATE_COMMIT_DATE`: the release
//! script and image builds, where there may be no `.git`), else what `git` says of the checkout;
//! outside a checkout, or without `git`, it is `unknown`. No dependency: a few `git` calls.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=MODELGATE_COMMIT");
    println!("cargo:rerun-if-env-changed=MODELGATE_COMMIT_DATE");

    let dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let from_env = |name: &str| {
        env::var(name)
            .ok()
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };

    let (commit, date) = match from_env("MODELGATE_COMMIT") {
        Some(commit) => (short(&commit), from_env("MODELGATE_COMMIT_DATE")),
        None => {
            watch_git(&dir);
            match git(&dir, &["rev-parse", "--verify", "--quiet", "HEAD"]) {
                Some(commit) => (
                    short(&commit),
                    git(&dir, &["log", "-1", "--format=%cs", "HEAD"]),
                ),
                None => ("unknown".to_owned(), None),
            }
        }
    };

    let version = env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    let long = match date {
        Some(date) => format!("{version} (commit {commit}, {date})"),
        None => format!("{version} (commit {commit})"),
    };
    println!("cargo:rustc-env=MODELGATE_BUILD_VERSION={long}");
}

/// The first 12 characters of a full hexadecimal commit id; anything else as given.
fn short(commit: &str) -> String {
    if commit.len() > 12 && commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        commit[..12].to_ascii_lowercase()
    } else {
        commit.to_owned()
    }
}

/// `git ARGS` in `dir`: its trimmed standard output when it succeeds and says something.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

/// Reruns this script when HEAD moves: `HEAD` itself (a checkout, a detached HEAD) and the
/// branch it points to, loose or packed. Only paths that exist are named (Cargo reruns a script
/// on every build for a missing one); outside a checkout, nothing is.
fn watch_git(dir: &Path) {
    let path = |name: &str| git(dir, &["rev-parse", "--git-path", name]).map(|p| dir.join(p));
    let mut watched = vec![path("HEAD"), path("packed-refs")];
    if let Some(branch) = git(dir, &["symbolic-ref", "--quiet", "HEAD"]) {
        watched.push(path(&branch));
    }
    for file in watched.into_iter().flatten().filter(|p| p.is_file()) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
}
