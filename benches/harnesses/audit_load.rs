//! `modelgate audit` on many objects from files: the figure docs/benchmarks.md reports (docs/policy.md
//! §10; the target is 20 000 pods in under 5 s).
//!
//! ```text
//! cargo build --release --bin modelgate --example audit_load
//! target/release/examples/audit_load [--objects 20000] [--runs 3] [--keep FILE]
//! ```
//!
//! It writes one YAML stream of `--objects` workloads shaped like `kubectl get -o yaml` output
//! (metadata with labels, owner references and managed fields, a status, mixed kinds: 80 % Pods,
//! then Deployments, Jobs and CronJobs; some denied, some with a model URI, a cache volume, octal
//! modes, a few documents written as JSON), runs the release `modelgate audit -o json` on it
//! `--runs` times, and prints each run's wall time, its CPU time (user and system; unlike the
//! wall time, independent of what else the machine runs) and the process's peak RSS (`VmHWM`,
//! sampled from /proc while it runs).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn pod(i: usize) -> String {
    let ns = format!("team-{}", i % 50);
    let mut security = String::new();
    let mut annotations = String::new();
    let mut volumes = String::from(
        "  - name: config\n    configMap:\n      name: app-config\n      defaultMode: 0440\n",
    );
    match i % 10 {
        // Denied: a root uid.
        0 => security = "    securityContext:\n      runAsUser: 0\n".into(),
        // Already compliant.
        1 | 2 => {
            security =
                "    securityContext:\n      runAsNonRoot: true\n      allowPrivilegeEscalation: false\n"
                    .into()
        }
        // A model server with a model URI and a writable cache.
        3 | 4 => {
            annotations = "    modelgate.io/model-uri: hf://org/llama-3-8b\n".into();
            volumes.push_str(
                "  - name: model-cache\n    persistentVolumeClaim:\n      claimName: models\n",
            );
        }
        _ => {}
    }
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: app-{i}-7d9f8b6c5-x2k4p
  generateName: app-{i}-7d9f8b6c5-
  namespace: {ns}
  uid: 3f6c2a1e-0000-4000-8000-{i:012}
  resourceVersion: \"{i}\"
  creationTimestamp: \"2026-11-30T12:00:00Z\"
  labels:
    app.kubernetes.io/name: app-{i}
    app.kubernetes.io/part-of: serving
    pod-template-hash: 7d9f8b6c5
  annotations:
    kubectl.kubernetes.io/restartedAt: \"2026-11-29T10:00:00Z\"
{annotations}  ownerReferences:
  - apiVersion: apps/v1
    kind: ReplicaSet
    name: app-{i}-7d9f8b6c5
    uid: 9a8b7c6d-0000-4000-8000-{i:012}
    controller: true
    blockOwnerDeletion: true
spec:
  serviceAccountName: default
  restartPolicy: Always
  terminationGracePeriodSeconds: 30
  dnsPolicy: ClusterFirst
  enableServiceLinks: yes
  containers:
  - name: app
    image: registry.example.com/team/app:1.{i}
    imagePullPolicy: IfNotPresent
    args: [\"--port=8080\", \"--log-level=info\"]
    ports:
    - containerPort: 8080
      name: http
      protocol: TCP
    env:
    - name: MODE
      value: \"on\"
    resources:
      requests: {{cpu: 100m, memory: 128Mi}}
      limits: {{memory: 256Mi}}
{security}    volumeMounts:
    - name: config
      mountPath: /etc/app
      readOnly: true
    readinessProbe:
      httpGet: {{path: /healthz, port: 8080}}
      periodSeconds: 10
  volumes:
{volumes}status:
  phase: Running
  podIP: 10.0.{}.{}
  qosClass: Burstable
  startTime: \"2026-11-30T12:00:01Z\"
  conditions:
  - type: Ready
    status: \"True\"
    lastTransitionTime: \"2026-11-30T12:00:05Z\"
  containerStatuses:
  - name: app
    ready: true
    restartCount: 0
    image: registry.example.com/team/app:1.{i}
    imageID: registry.example.com/team/app@sha256:{i:064}
    containerID: containerd://{i:064}
    state:
      running: {{startedAt: \"2026-11-30T12:00:02Z\"}}
",
        (i / 250) % 256,
        i % 250
    )
}

fn deployment(i: usize) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web-{i}
  namespace: team-{}
  labels: {{app: web-{i}}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: web-{i}}}}}
  template:
    metadata:
      labels: {{app: web-{i}}}
    spec:
      containers:
      - name: web
        image: nginx:1.27
        ports: [{{containerPort: 80}}]
",
        i % 50
    )
}

fn job_as_json(i: usize) -> String {
    format!(
        "{{\"apiVersion\": \"batch/v1\", \"kind\": \"Job\", \"metadata\": {{\"name\": \"convert-{i}\", \"namespace\": \"team-{}\"}},
 \"spec\": {{\"backoffLimit\": 2, \"template\": {{\"spec\": {{\"restartPolicy\": \"Never\",
   \"containers\": [{{\"name\": \"convert\", \"image\": \"tool:1\", \"args\": [\"--from\", \"a\", \"--to\", \"b\"]}}]}}}}}}}}
",
        i % 50
    )
}

fn cronjob(i: usize) -> String {
    format!(
        "apiVersion: batch/v1
kind: CronJob
metadata: {{name: nightly-{i}, namespace: team-{}}}
spec:
  schedule: \"0 3 * * *\"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          volumes: [{{name: model-cache, persistentVolumeClaim: {{claimName: models}}}}]
          containers: [{{name: sync, image: sync:2, securityContext: {{runAsNonRoot: false}}}}]
",
        i % 50
    )
}

fn corpus(objects: usize) -> String {
    let mut out = String::new();
    for i in 0..objects {
        if i > 0 {
            out.push_str("---\n");
        }
        let doc = match i % 10 {
            0..=7 => pod(i),
            8 if i % 20 == 8 => deployment(i),
            8 => job_as_json(i),
            _ => cronjob(i),
        };
        out.push_str(&doc);
    }
    out
}

/// Peak RSS of a running process in KiB, while it still has its memory.
fn hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// CPU seconds (user, system) of this process's waited-for children so far
/// (`cutime`/`cstime` in /proc/self/stat), at the kernel's 100 ticks a second.
fn children_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of the whole line, 14 and 15 after the name.
    let ticks = |i: usize| fields[i].parse::<f64>().unwrap() / 100.0;
    (ticks(13), ticks(14))
}

fn main() {
    let mut objects = 20_000;
    let mut runs = 3;
    let mut keep: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().expect("a value after the flag");
        match a.as_str() {
            "--objects" => objects = value().parse().expect("--objects N"),
            "--runs" => runs = value().parse().expect("--runs N"),
            "--keep" => keep = Some(PathBuf::from(value())),
            _ => panic!("usage: audit_load [--objects 20000] [--runs 3] [--keep FILE]"),
        }
    }
    let exe = std::env::current_exe().unwrap();
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("modelgate"))
        .filter(|p| p.is_file())
        .expect("build it first: cargo build --release --bin modelgate --example audit_load");

    let text = corpus(objects);
    let dir = std::env::temp_dir().join(format!("modelgate-audit-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = keep.unwrap_or_else(|| dir.join("workloads.yaml"));
    std::fs::write(&file, &text).unwrap();
    println!(
        "corpus: {objects} objects, {:.1} MiB of YAML ({})",
        text.len() as f64 / 1048576.0,
        file.display()
    );

    let mut summary = String::new();
    for run in 1..=runs {
        // The report goes to a file: a pipe nobody reads until the end would stall the child.
        let report_path = dir.join("report.json");
        let cpu_before = children_cpu();
        let started = Instant::now();
        let mut child = Command::new(&binary)
            .args(["audit", "-o", "json"])
            .arg(&file)
            .stdout(std::fs::File::create(&report_path).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut peak = 0;
        let status = loop {
            if let Some(kib) = hwm_kib(pid) {
                peak = peak.max(kib);
            }
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let elapsed = started.elapsed();
        let cpu_after = children_cpu();
        let (user, system) = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
        let out = std::fs::read_to_string(&report_path).unwrap();
        let report: serde_json::Value = serde_json::from_str(&out).expect("a JSON report");
        assert!(
            status.code() == Some(1),
            "some objects are denied by design: {status}"
        );
        writeln!(
            summary,
            "run {run}: {:.2} s wall, {user:.2} s user + {system:.2} s system CPU, peak RSS {:.0} MiB; evaluated {} (patched {}, denied {}, unchanged {})",
            elapsed.as_secs_f64(),
            peak as f64 / 1024.0,
            report["objects"],
            report["patched"],
            report["denied"],
            report["unchanged"]
        )
        .unwrap();
    }
    print!("{summary}");
    let _ = std::fs::remove_dir_all(&dir);
}
