"""The alerts and the dashboard against real Prometheus: `promtool check rules` on the rendered
rules, then a Prometheus server scraping a running `modelgate serve --dev` under a little load,
with every alert expression and every dashboard query evaluated through its HTTP API. Each must
parse, and each metric name it reads must be one that serve exports (or one of EXTERNAL)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from k8s import load, one
from promql import grafana_to_promql, metric_names, variable_query_selector
from tools import NS, Assets, run

JOB = "modelgate"  # the Service's name: the job label the ServiceMonitor gives the targets

# Metrics the alerts and the dashboard read that come from elsewhere than modelgate.
EXTERNAL = {
    "up": "Prometheus (every target)",
    "kube_deployment_status_replicas_available": "kube-state-metrics",
    "apiserver_admission_webhook_rejection_count": "kube-apiserver",
    "apiserver_admission_webhook_fail_open_count": "kube-apiserver",
    "apiserver_admission_webhook_admission_duration_seconds_bucket": "kube-apiserver",
}


@pytest.fixture(scope="module")
def rules_file(assets: Assets) -> Path:
    render = assets.render("rules", "--set", "monitoring.prometheusRule.enabled=true")
    path = assets.work / "rules.yaml"
    path.write_text(yaml.safe_dump(one(load(render), "PrometheusRule")["spec"], sort_keys=False))
    return path


def rule_list(rules_file: Path) -> list[dict]:
    return [r for g in yaml.safe_load(rules_file.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules(assets: Assets, rules_file: Path) -> None:
    out = run(assets.tool("promtool"), "check", "rules", rules_file).stdout
    assert f"SUCCESS: {len(rule_list(rules_file))} rules found" in out, out


def test_promtool_refuses_a_broken_rule(assets: Assets) -> None:
    bad = assets.work / "bad-rules.yaml"
    bad.write_text("groups: [{name: g, rules: [{alert: A, expr: 'sum(rate(x[5m]) >'}]}]\n")
    r = run(assets.tool("promtool"), "check", "rules", bad, ok=False)
    assert r.returncode != 0, r.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, probe, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            result = probe()
            if result:
                return result
        except OSError as e:  # not listening yet
            last = e
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} ({last})")


def pod_review(uid: str, run_as_user: int | None = None) -> bytes:
    sc = {} if run_as_user is None else {"securityContext": {"runAsUser": run_as_user}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "load-", "namespace": "team-a"},
           "spec": {"containers": [{"name": "c", "image": "busybox", **sc}]}}  # fmt: skip
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-a",
                    "operation": "CREATE", "userInfo": {"username": "load"}, "object": pod},
    }).encode()  # fmt: skip


# One exception held, so that modelgate_exception_expiry_timestamp_seconds has a series (it has
# none without one). It expires long after the test, so ModelgateExceptionExpiresSoon stays quiet.
EXCEPTION = {
    "apiVersion": "modelgate.io/v1alpha1", "kind": "ModelgateException",
    "metadata": {"name": "vendor-root", "namespace": "team-a"},
    "spec": {"reason": "vendor image runs as root", "expires": "2099-01-01T00:00:00Z", "rules": ["non-root"],
             "selector": {"matchLabels": {"app": "vendor"}}},
}  # fmt: skip


class Serve:
    """`modelgate serve --dev` on free local ports, with a generated certificate and EXCEPTION."""

    def __init__(self, binary: Path, work: Path):
        self.port, self.probe_port = free_port(), free_port()
        self.log = open(work / "serve.log", "w")  # noqa: SIM115 - closed in stop()
        exceptions = work / "exceptions.yaml"
        exceptions.write_text(yaml.safe_dump(EXCEPTION))
        self.proc = subprocess.Popen(
            [str(binary), "serve", "--dev", "--certs-dir", str(work / "dev-certs"), "--caches", str(exceptions),
             f"--listen=127.0.0.1:{self.port}", f"--probe-listen=127.0.0.1:{self.probe_port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for("serve /readyz", lambda: self.get("/readyz")[0] == 200)

    def get(self, path: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.probe_port, timeout=5)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def load(self, rounds: int) -> dict[int, int]:
        """Mutate and validate reviews (allowed, patched, denied) plus bodies that count as errors."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # the dev certificate; TLS itself is tested elsewhere
        statuses: dict[int, int] = {}
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx, timeout=10)
        requests = []
        for i in range(rounds):
            requests += [
                ("/mutate", "application/json", pod_review(f"m{i}")),
                ("/validate", "application/json", pod_review(f"v{i}", 1000)),
                ("/validate", "application/json", pod_review(f"d{i}", 0)),  # denied
            ]
        requests += [("/mutate", "application/json", b"{not json"), ("/validate", "text/plain", b"{}")]
        for path, ctype, body in requests:
            conn.request("POST", path, body=body, headers={"Content-Type": ctype})
            r = conn.getresponse()
            r.read()
            statuses[r.status] = statuses.get(r.status, 0) + 1
        conn.close()
        return statuses

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Prometheus:
    def __init__(self, binary: str, work: Path, target: str, rules: Path):
        self.port = free_port()
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target], "labels": {"namespace": NS}}]}],
        }))  # fmt: skip
        self.log = open(work / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={work / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for("Prometheus /-/ready", lambda: self.raw("/-/ready")[0] == 200)

    def raw(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def api(self, path: str, **params: str) -> tuple[int, dict]:
        status, body = self.raw(path + "?" + urllib.parse.urlencode(params))
        return status, json.loads(body)

    def query(self, expr: str) -> dict:
        status, body = self.api("/api/v1/query", query=expr)
        assert status == 200 and body["status"] == "success", f"Prometheus refused {expr!r}: {body}"
        return body["data"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(assets: Assets, modelgate_bin: Path, rules_file: Path):
    work = assets.work / "live"
    work.mkdir(exist_ok=True)
    serve = Serve(modelgate_bin, work)
    prom = None
    try:
        prom = Prometheus(assets.tool("prometheus"), work, f"127.0.0.1:{serve.probe_port}", rules_file)
        statuses = {}
        # A little load over several scrapes, so rate() has samples to work with.
        for _ in range(4):
            for k, v in serve.load(rounds=10).items():
                statuses[k] = statuses.get(k, 0) + v
            time.sleep(1.0)
        assert statuses.get(200, 0) >= 120 and statuses.get(400) and statuses.get(415), statuses

        def scrapes() -> float:
            result = prom.query(f'count_over_time(up{{job="{JOB}"}}[1m])')["result"]
            return float(result[0]["value"][1]) if result else 0.0

        def rules_evaluated() -> bool:
            groups = prom.api("/api/v1/rules")[1]["data"]["groups"]
            return all(not r.get("lastEvaluation", "0001").startswith("0001") for g in groups for r in g["rules"])

        wait_for("3 scrapes of serve", lambda: scrapes() >= 3)
        wait_for("the rules evaluated", rules_evaluated)
        yield prom
    finally:
        if prom:
            prom.stop()
        serve.stop()


@pytest.fixture(scope="module")
def exported(prometheus: Prometheus) -> set[str]:
    """Metric names Prometheus has from the serve target."""
    status, body = prometheus.api("/api/v1/series", **{"match[]": f'{{job="{JOB}"}}'})
    assert status == 200, body
    names = {s["__name__"] for s in body["data"]}
    assert "modelgate_admission_requests_total" in names and "process_cpu_seconds_total" in names, sorted(names)
    return names


def check_names(expr: str, exported: set[str]) -> list[str]:
    """The problems with expr's metric names: unknown ones (nothing exports them)."""
    problems = []
    for name in sorted(metric_names(expr)):
        if name in exported:
            continue
        if name in EXTERNAL:
            assert not name.startswith(("modelgate_", "process_")), f"{name} is ours, it cannot be external"
            continue
        problems.append(f"{name} (in {expr!r}) is not exported by modelgate serve")
    return problems


def test_process_metrics_are_scraped(prometheus: Prometheus) -> None:
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds"):
        result = prometheus.query(f'{name}{{job="{JOB}"}}')["result"]
        assert result and float(result[0]["value"][1]) > 0, f"{name}: {result}"


def test_every_alert_parses_evaluates_and_reads_exported_metrics(prometheus: Prometheus, exported, rules_file) -> None:
    problems = []
    for rule in rule_list(rules_file):
        prometheus.query(rule["expr"])
        problems += check_names(rule["expr"], exported)
    assert not problems, "\n".join(problems)
    # Prometheus loaded the same rules and evaluated them without error.
    groups = prometheus.api("/api/v1/rules")[1]["data"]["groups"]
    loaded = {r["name"]: r for g in groups for r in g["rules"]}
    assert set(loaded) == {r["alert"] for r in rule_list(rules_file)}
    unhealthy = {n: r.get("lastError") for n, r in loaded.items() if r["health"] != "ok"}
    assert not unhealthy, unhealthy


def test_a_healthy_serve_fires_no_alert_but_the_error_ratio(prometheus: Prometheus) -> None:
    """A rule active against a healthy serve would page on every install."""
    _, body = prometheus.api("/api/v1/alerts")
    active = sorted({a["labels"]["alertname"] for a in body["data"]["alerts"]})
    # ModelgateAdmissionErrors: the load sends 2 bad bodies per 30 reviews (>5%) on purpose.
    assert set(active) <= {"ModelgateAdmissionErrors"}, active


def test_every_dashboard_query_parses_evaluates_and_reads_exported_metrics(assets: Assets, prometheus: Prometheus, exported) -> None:
    dash = json.loads((assets.chart / "files" / "dashboards" / "modelgate.json").read_text())
    variables = {"namespace": NS, "job": JOB, "datasource": "prometheus"}
    problems, count = [], 0
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            expr = grafana_to_promql(target["expr"], variables)
            assert "$" not in expr, f"panel {panel['title']!r}: an unknown variable in {expr!r}"
            prometheus.query(expr)
            problems += check_names(expr, exported)
            count += 1
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            selector = variable_query_selector(var["query"]["query"])
            assert selector, f"variable {var['name']}: not a label_values() query"
            expr = grafana_to_promql(selector, variables)
            result = prometheus.query(expr)["result"]
            assert result, f"variable {var['name']}: {expr} has no series, the dashboard would show nothing"
            problems += check_names(expr, exported)
    assert count >= 15, f"only {count} dashboard queries"
    assert not problems, "\n".join(problems)


def test_an_unexported_metric_is_caught(exported) -> None:
    """The name check can fail."""
    assert check_names("rate(modelgate_no_such_metric_total[5m])", exported)
    assert not check_names("rate(modelgate_admission_requests_total[5m])", exported)
