//! The README's "Run it" section, run as written: every shell command of its ```sh blocks, with
//! only `cargo run --release --` replaced by the binary cargo built for this test, in a scratch
//! directory holding a copy of `examples/`. `serve --dev` is started, the `curl` command it
//! prints is run against it and must get an allowed, patched answer, then the server gets
//! SIGTERM and must exit 0. Every `review` command must exit 0 with a model cache hit. So the
//! README cannot drift from what works.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::Value;

const CARGO_RUN: &str = "cargo run --release --";

/// The shell commands of the README's `## Run it` section, continuation lines joined, comments
/// and blank lines dropped.
fn run_it_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Run it\n"))
        .expect("the README has a `## Run it` section");
    let mut commands = Vec::new();
    let mut in_shell = false;
    let mut pending = String::new();
    for line in section.lines() {
        let line = line.trim_end();
        if !in_shell {
            in_shell = matches!(line, "```sh" | "```bash" | "```shell");
            continue;
        }
        if line.starts_with("```") {
            in_shell = false;
            continue;
        }
        if let Some(part) = line.strip_suffix('\\') {
            pending.push_str(part);
            continue;
        }
        pending.push_str(line);
        let command = std::mem::take(&mut pending).trim().to_string();
        if !command.is_empty() && !command.starts_with('#') {
            commands.push(command);
        }
    }
    commands
}

/// `command` for `sh -c`, with `cargo run --release --` replaced by the built binary.
fn with_built_binary(command: &str) -> String {
    let binary = env!("CARGO_BIN_EXE_modelgate");
    assert!(!binary.contains('\''), "{binary}");
    command.replace(CARGO_RUN, &format!("'{binary}'"))
}

/// A shell in `dir` with no `MODELGATE_*` variable from the test's own environment.
fn shell(dir: &Path, command: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(command).current_dir(dir);
    for (k, _) in std::env::vars() {
        if k.starts_with("MODELGATE_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn scratch_with_examples() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    std::fs::create_dir(dir.path().join("examples")).unwrap();
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(
                &path,
                dir.path().join("examples").join(path.file_name().unwrap()),
            )
            .unwrap();
        }
    }
    dir
}

#[test]
fn every_run_it_command_works_as_written() {
    let commands = run_it_commands();
    let serve: Vec<&String> = commands.iter().filter(|c| c.contains(" serve ")).collect();
    let reviews: Vec<&String> = commands.iter().filter(|c| c.contains(" review ")).collect();
    assert_eq!(serve.len(), 1, "one `serve --dev` command: {commands:?}");
    assert!(serve[0].contains("--dev"), "{}", serve[0]);
    assert!(
        !reviews.is_empty(),
        "at least one `review` command: {commands:?}"
    );
    assert_eq!(
        serve.len() + reviews.len(),
        commands.len(),
        "a Run it command this test does not know how to check: {commands:?}"
    );
    for command in &commands {
        assert!(command.starts_with(CARGO_RUN), "{command}");
    }
    let dir = scratch_with_examples();
    for command in reviews {
        check_review_command(dir.path(), command);
    }
    check_serve_dev(dir.path(), serve[0]);
}

/// A `review` command exits 0 and shows a model cache hit, in whichever output it asked for.
fn check_review_command(dir: &Path, command: &str) {
    let out: Output = shell(dir, &with_built_binary(command)).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{command}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(!stdout.trim().is_empty(), "{command}: no output");
    for line in stdout.lines() {
        let hit = match serde_json::from_str::<Value>(line) {
            // -o patch: the annotation a hit sets, with a cache reference rather than "miss".
            Ok(Value::Array(ops)) => ops.iter().any(|op| {
                op["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("/annotations/modelgate.io~1model-cache"))
                    && op["value"].as_str().is_some_and(|v| v != "miss")
            }),
            Ok(other) => panic!("{command}: unexpected JSON output {other}"),
            // The summary: a Pod's hit, or the model a Job's pods would mount (a template is
            // not routed; its pods are, each when it is created).
            Err(_) => {
                line.contains("; model cache hit: ")
                    || line.contains("warnings: pods created now would mount model ")
            }
        };
        assert!(
            hit,
            "{command}: not a model cache hit:\n{line}\nstderr:\n{stderr}"
        );
    }
}

/// Reads the child's stdout lines on a thread, so the test can wait with a deadline.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn check_serve_dev(dir: &Path, command: &str) {
    // `exec`, so the signal reaches the server itself. The ports come from the environment (not
    // from the command, which stays as written) so that parallel tests never collide; the
    // loopback default itself is checked by the serve unit tests. A short grace keeps the test
    // short.
    let mut child = shell(dir, &format!("exec {}", with_built_binary(command)))
        .env("MODELGATE_LISTEN", "127.0.0.1:0")
        .env("MODELGATE_PROBE_LISTEN", "127.0.0.1:0")
        .env("MODELGATE_SHUTDOWN_GRACE", "1s")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("serve.log")).unwrap())
        .spawn()
        .unwrap();
    let lines = lines_of(&mut child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut banner = Vec::new();
    let curl = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.trim_start().starts_with("curl ") => break line.trim().to_string(),
            Ok(line) => banner.push(line),
            Err(e) => {
                let _ = child.kill();
                let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
                panic!("{command}: no curl command printed ({e}); output:\n{banner:?}\n{log}")
            }
        }
    };
    assert!(
        banner
            .iter()
            .any(|l| l.contains("serving https://127.0.0.1:")),
        "{banner:?}"
    );
    let out = shell(dir, &curl).output().unwrap();
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{curl}\n{body}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let review: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let sample: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("examples/admissionreview-pod.json")).unwrap(),
    )
    .unwrap();
    let response = &review["response"];
    assert_eq!(response["uid"], sample["request"]["uid"], "{body}");
    assert_eq!(response["allowed"], true, "{body}");
    assert_eq!(response["patchType"], "JSONPatch", "{body}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .unwrap();
    let ops: Vec<Value> = serde_json::from_slice(&patch).unwrap();
    assert!(
        ops.iter()
            .any(|op| op["path"] == "/spec/securityContext" && op["value"]["runAsNonRoot"] == true),
        "{ops:?}"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("serve --dev did not stop within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "serve --dev exited with {exit}");
}

/// `examples/cluster-state.yaml` holds everything docs/policy.md §5 needs for a hit, and nothing is
/// there by accident: without the PVC, the Nodes or the cache's status, the Pod is a miss with
/// the reason that names what is missing.
#[test]
fn the_example_cluster_state_is_what_a_hit_needs() {
    let dir = scratch_with_examples();
    let state = std::fs::read_to_string(dir.path().join("examples/cluster-state.yaml")).unwrap();
    let documents: Vec<&str> = state.split("\n---\n").collect();
    let without = |drop: &dyn Fn(&str) -> Option<String>| -> String {
        documents
            .iter()
            .filter_map(|d| drop(d))
            .collect::<Vec<_>>()
            .join("\n---\n")
    };
    let cases: [(&str, String); 3] = [
        (
            "pvc-missing",
            without(&|d| (!d.contains("\nkind: PersistentVolumeClaim\n")).then(|| d.to_string())),
        ),
        (
            "not-downloaded",
            without(&|d| (!d.contains("\nkind: Node\n")).then(|| d.to_string())),
        ),
        (
            "not-downloaded",
            without(&|d| Some(d.split("\nstatus:\n").next().unwrap().to_string())),
        ),
    ];
    let summary = |caches: &str| {
        let out = shell(
            dir.path(),
            &format!(
                "'{}' review examples/pod.yaml --caches {caches}",
                env!("CARGO_BIN_EXE_modelgate")
            ),
        )
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(
        summary("examples/cluster-state.yaml").contains("; model cache hit: "),
        "the complete state is a hit"
    );
    for (i, (reason, text)) in cases.iter().enumerate() {
        let file = format!("state-{i}.yaml");
        std::fs::write(dir.path().join(&file), text).unwrap();
        let line = summary(&file);
        assert!(
            line.contains(&format!("; model cache miss: {reason}")),
            "case {i}: {line}"
        );
    }
}
