//! Every admission costs time linear in its body (docs/policy.md §7), checked in instructions, not
//! seconds: `benches/harnesses/cost_probe.rs` builds each hostile shape at 16 KiB and at 64 KiB and
//! answers it through `/mutate` and `/validate` under callgrind, whose counts are the same on a
//! busy machine. Only the decisions are counted (callgrind's `--toggle-collect` on the one entry
//! point, `admission::review`), not the probe building its review. Linear work grows 4× from one size to the other, quadratic work 16×; the bound
//! is 6× (what sorting a map adds to linear stays far below it). A run that does not finish
//! within its time limit is superlinear too.
//!
//! Needs valgrind (Debian's package, on every machine of this project) and the example, which
//! `cargo test` builds; both missing is a failure, never a skip.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

const SMALL: usize = 16 * 1024;
const LARGE: usize = 4 * SMALL;
/// Linear is 4×, quadratic 16×.
const MAX_GROWTH: f64 = 6.0;
/// The pipeline's one entry point: callgrind counts the instructions spent inside it.
const DECISION: &str = "modelgate_core::admission::review";
/// The longest one run may take under callgrind (a linear one takes a few seconds).
const RUN_LIMIT: Duration = Duration::from_secs(120);

fn probe() -> PathBuf {
    // target/<profile>/deps/cost_bounds-<hash> → target/<profile>/examples/cost_probe
    let exe = std::env::current_exe().unwrap();
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples/cost_probe");
    assert!(
        path.exists(),
        "{} is missing: `cargo test` builds it (or `cargo build --example cost_probe`)",
        path.display()
    );
    path
}

struct Measured {
    instructions: u64,
    report: Value,
}

/// One probe run under callgrind: its instruction count and what it printed.
fn measure(shape: &str, bytes: usize, kind: &str) -> Measured {
    let mut child = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            "--error-exitcode=3",
        ])
        .arg(format!("--toggle-collect={DECISION}"))
        .arg(probe())
        .args([shape, &bytes.to_string(), kind])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("valgrind (Debian's package) is required: {e}"));
    let started = std::time::Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            panic!(
                "{shape} at {bytes} bytes ({kind}) did not finish within {RUN_LIMIT:?} under callgrind: superlinear"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{shape} {bytes} {kind}: {stderr}");
    let instructions = stderr
        .lines()
        .find_map(|l| l.split("Collected : ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no instruction count in:\n{stderr}"));
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    });
    Measured {
        instructions,
        report,
    }
}

fn shapes() -> Vec<String> {
    let out = Command::new(probe()).arg("list").output().unwrap();
    assert!(out.status.success());
    let shapes: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(shapes.len() >= 10, "{shapes:?}");
    shapes
}

#[test]
fn every_hostile_shape_costs_instructions_linear_in_its_body_and_answers_in_bounded_bytes() {
    let mut jobs: Vec<(String, &str)> = Vec::new();
    for shape in shapes() {
        jobs.push((shape.clone(), "pod"));
        jobs.push((shape, "deployment"));
    }
    // What every shape costs at size 0: the two decisions on the reference pod, and on it as
    // a Deployment's template. The shapes differ from it by a few hundred
    // instructions at size 0, far below what 16 KiB of any of them costs.
    let baselines = [
        measure("uri-slashes", 0, "pod"),
        measure("uri-slashes", 0, "deployment"),
    ];
    let baselines = &baselines;
    let results = Mutex::new(Vec::new());
    let next = Mutex::new(jobs.into_iter());
    // Two at a time: the machine has two cores.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                loop {
                    let Some((shape, kind)) = next.lock().unwrap().next() else {
                        break;
                    };
                    let base = baselines[usize::from(kind == "deployment")].instructions;
                    let small = measure(&shape, SMALL, kind);
                    let large = measure(&shape, LARGE, kind);
                    results
                        .lock()
                        .unwrap()
                        .push((shape, kind, base, small, large));
                }
            });
        }
    });
    let mut failures = Vec::new();
    let mut table = String::new();
    for (shape, kind, base, small, large) in results.into_inner().unwrap() {
        let grow = |m: &Measured| m.instructions.saturating_sub(base) as f64;
        assert!(
            base > 0 && small.instructions > base,
            "{shape} ({kind}): callgrind counted {base} → {} instructions inside {DECISION}: has the entry point been renamed?",
            small.instructions
        );
        let growth = grow(&large) / grow(&small).max(1.0);
        table.push_str(&format!(
            "{shape:>26} {kind:>10}: {base} → {} → {} instructions, ×{growth:.1}\n",
            small.instructions, large.instructions
        ));
        if growth > MAX_GROWTH {
            failures.push(format!(
                "{shape} ({kind}): ×{growth:.1} from {SMALL} to {LARGE} bytes (linear is ×4; profile with `valgrind --tool=callgrind --toggle-collect={DECISION} target/debug/examples/cost_probe {shape} {LARGE} {kind}`)"
            ));
        }
        let body = large.report["body_bytes"].as_u64().unwrap();
        for webhook in ["mutate", "validate"] {
            let answer = &large.report[webhook];
            let bytes = answer["answer_bytes"].as_u64().unwrap();
            // A denial or a `/validate` answer carries no patch: its size is capped (20
            // violations, 20 warnings); a patch grows with what it patches.
            let patch = webhook == "mutate" && answer["allowed"] == true;
            // A patch is at most 1 MiB (base64: 4/3 of it), else the pod is denied.
            let limit = match patch {
                true => (10 * body).min((1 << 20) * 4 / 3) + 64 * 1024,
                false => 64 * 1024,
            };
            if bytes > limit {
                failures.push(format!(
                    "{shape} ({kind}): the {webhook} answer is {bytes} bytes for a {body} byte body (limit {limit})"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}\n{table}", failures.join("\n"));
    eprintln!("{table}");
}
