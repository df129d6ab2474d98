//! The real binary as a command-line tool (`review`, `audit`), for the CLI tests: run in a clean
//! environment, so that nothing the test's own environment holds (`MODELGATE_*` flags,
//! `POD_NAMESPACE`, an in-cluster configuration, the user's kubeconfig) changes what it does.
//! Included by those tests with `#[path = "common/cli.rs"] mod cli;`, without the TLS helpers
//! of `common/mod.rs`.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

#[path = "required.rs"]
mod required;
pub use required::missing;

/// What one run of the binary left: its exit code and output.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    pub fn json_lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not one JSON value per line ({e}): {l}"))
            })
            .collect()
    }
}

/// `modelgate <args>` with a clean environment: no `MODELGATE_*`, `POD_NAMESPACE` or
/// `KUBERNETES_SERVICE_HOST` inherited, and `KUBECONFIG` pointing at no file (set it again to
/// reach a fake API server). Stdin is empty, stdout and stderr are captured.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_modelgate"));
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("MODELGATE_") || k == "POD_NAMESPACE" || k == "KUBERNETES_SERVICE_HOST" {
            cmd.env_remove(k);
        }
    }
    cmd.env("KUBECONFIG", "/nonexistent");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs `cmd` to its end, feeding `stdin` when given.
pub fn run(mut cmd: Command, stdin: Option<&str>) -> Run {
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().expect("the modelgate binary starts");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(text.as_bytes()).unwrap();
    }
    finish(child.wait_with_output().unwrap())
}

pub fn finish(out: std::process::Output) -> Run {
    Run {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// `modelgate <args>` in a clean environment plus `env`, feeding `stdin` when given.
pub fn modelgate_env(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Run {
    let mut cmd = command(args);
    cmd.envs(env.iter().copied());
    run(cmd, stdin)
}

pub fn modelgate(args: &[&str]) -> Run {
    modelgate_env(args, &[], None)
}

/// `modelgate review <args>`.
pub fn review(args: &[&str]) -> Run {
    let mut all = vec!["review"];
    all.extend_from_slice(args);
    modelgate(&all)
}

pub fn assert_exit(run: &Run, code: i32) {
    assert_eq!(
        run.code, code,
        "exit code\nstdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
}

/// A file of `tests/fixtures`.
pub fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// Where `scripts/inputs.sh` puts the tests' inputs from outside the repository (the corpus,
/// the kube-cel binaries, ...; `tests/inputs.json`, docs/test-inputs.md): `$MODELGATE_INPUTS_DIR`
/// (relative to the repository), default `.inputs`.
pub fn inputs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(std::env::var_os("MODELGATE_INPUTS_DIR").unwrap_or_else(|| ".inputs".into()))
}

/// The corpus (`<inputs>/corpus`, see [`inputs_dir`]), or `None` where it is absent (see
/// [`missing`]).
pub fn corpus_dir() -> Option<PathBuf> {
    let dir = inputs_dir().join("corpus");
    if dir
        .join("kserve/localmodelcache_readme_objects.yaml")
        .is_file()
    {
        Some(dir)
    } else {
        missing(&format!(
            "the corpus ({}: scripts/inputs.sh resolves it)",
            dir.display()
        ));
        None
    }
}
