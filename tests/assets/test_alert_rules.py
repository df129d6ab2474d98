"""Each alert of the PrometheusRule fires on the condition docs/operations.md gives for it, and
stays quiet on a healthy counterpart: `promtool test rules` on synthetic series."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tools import NS, Assets

SEL = f'job="modelgate",namespace="{NS}"'


def case(alert: str, series: dict[str, str], at: str, fires: list[dict[str, str]]) -> dict:
    return {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series.items()],
        "alert_rule_test": [
            {"eval_time": at, "alertname": alert, "exp_alerts": [{"exp_labels": {"alertname": alert, **f}} for f in fires]}
        ],
    }


def histogram(name: str, labels: str, slow: bool) -> dict[str, str]:
    """Ten observations a minute, all under 100 ms, or all between 1 s and 5 s."""
    fast = "0+10x40"
    none = "0+0x40"
    return {
        f'{name}{{{labels},le="0.1"}}': none if slow else fast,
        f'{name}{{{labels},le="1"}}': none if slow else fast,
        f'{name}{{{labels},le="5"}}': fast,
        f'{name}{{{labels},le="+Inf"}}': fast,
    }


CRIT = {"severity": "critical"}
WARN = {"severity": "warning"}
UP = {f"up{{{SEL}}}": "1x40"}
DEPLOY = f'kube_deployment_status_replicas_available{{namespace="{NS}",deployment="modelgate"}}'
MUTATE_HOOK = 'name="mutate.modelgate.io",type="admit",operation="CREATE"'
# The workload controllers' entry of the validating configuration (docs/policy.md §11).
CONTROLLERS_HOOK = 'name="validate-controllers.modelgate.io",type="validating",operation="UPDATE"'
EXPIRY = "modelgate_exception_expiry_timestamp_seconds"
# The exception's namespace, as Prometheus stores it: the target's `namespace` label wins, and
# modelgate's own becomes `exported_namespace`.
VENDOR_ROOT = 'exported_namespace="team-a",name="vendor-root"'

CASES = {
    "no ready replica (kube-state-metrics)": case(
        "ModelgateNoReadyReplica", {DEPLOY: "0x40", **UP}, "5m", [{**CRIT, "namespace": NS, "deployment": "modelgate"}]
    ),
    "no modelgate target up": case(
        "ModelgateNoReadyReplica", {f"up{{{SEL}}}": "0x40"}, "5m", [{**CRIT, "job": "modelgate", "namespace": NS}]
    ),
    "no modelgate target at all": case(
        "ModelgateNoReadyReplica", {'up{job="other"}': "1x40"}, "5m", [{**CRIT, "job": "modelgate", "namespace": NS}]
    ),
    "healthy replicas": case("ModelgateNoReadyReplica", {DEPLOY: "2x40", **UP}, "5m", []),
    "10% of requests fail": case(
        "ModelgateAdmissionErrors",
        {f'modelgate_admission_errors_total{{{SEL},reason="deadline_exceeded"}}': "0+10x40",
         f"modelgate_admission_requests_total{{{SEL}}}": "0+100x40"},
        "20m", [{**WARN, "job": "modelgate", "namespace": NS}],
    ),
    "1% of requests fail": case(
        "ModelgateAdmissionErrors",
        {f'modelgate_admission_errors_total{{{SEL},reason="invalid_json"}}': "0+1x40",
         f"modelgate_admission_requests_total{{{SEL}}}": "0+100x40"},
        "20m", [],
    ),
    "p99 over half the mutate timeout": case(
        "ModelgateLatencyHigh", histogram("modelgate_admission_duration_seconds_bucket", f'{SEL},webhook="mutate"', True),
        "20m", [{**WARN, "job": "modelgate", "namespace": NS, "webhook": "mutate"}],
    ),
    "p99 under 100 ms": case(
        "ModelgateLatencyHigh", histogram("modelgate_admission_duration_seconds_bucket", f'{SEL},webhook="validate"', False),
        "20m", [],
    ),
    "certificate expires in 10 days": case(
        "ModelgateCertificateExpiring", {f"modelgate_tls_certificate_expiry_timestamp_seconds{{{SEL}}}": "864000x40"},
        "20m", [{**WARN, "job": "modelgate", "namespace": NS}],
    ),
    "certificate expires in 100 days": case(
        "ModelgateCertificateExpiring", {f"modelgate_tls_certificate_expiry_timestamp_seconds{{{SEL}}}": "8640000x40"},
        "20m", [],
    ),
    "a cache kind never listed": case(
        "ModelgateCachesNotSynced", {f'modelgate_cache_synced{{{SEL},kind="LocalModelCache"}}': "0x40"},
        "15m", [{**WARN, "job": "modelgate", "namespace": NS, "kind": "LocalModelCache"}],
    ),
    "caches listed after 5 minutes": case(
        "ModelgateCachesNotSynced", {f'modelgate_cache_synced{{{SEL},kind="LocalModelCache"}}': "0x5 1x35"},
        "15m", [],
    ),
    "a watch fails every minute and never lists": case(
        "ModelgateWatchFailing",
        {f'modelgate_watch_last_failure_timestamp_seconds{{{SEL},watch="PersistentVolumeClaim"}}': "0+60x40",
         f'modelgate_watch_last_progress_timestamp_seconds{{{SEL},watch="PersistentVolumeClaim"}}': "0x40"},
        "25m", [{**WARN, "job": "modelgate", "namespace": NS, "watch": "PersistentVolumeClaim"}],
    ),
    "a watch fails every 5 minutes (a blackholed API server) after listing long ago": case(
        "ModelgateWatchFailing",
        {f'modelgate_watch_last_failure_timestamp_seconds{{{SEL},watch="Namespace"}}':
         "0 0 0 0 0 300 300 300 300 300 600 600 600 600 600 900 900 900 900 900 1200 1200 1200 1200 1200 1500 1500 1500 1500 1500",
         f'modelgate_watch_last_progress_timestamp_seconds{{{SEL},watch="Namespace"}}': "60x40"},
        "29m", [{**WARN, "job": "modelgate", "namespace": NS, "watch": "Namespace"}],
    ),
    "one failure in a quiet cluster, the watch working since": case(
        "ModelgateWatchFailing",
        {f'modelgate_watch_last_failure_timestamp_seconds{{{SEL},watch="Namespace"}}': "0x2 120x38",
         f'modelgate_watch_last_progress_timestamp_seconds{{{SEL},watch="Namespace"}}': "60x40"},
        "25m", [],
    ),
    "failures, but lists and events get through": case(
        "ModelgateWatchFailing",
        {f'modelgate_watch_last_failure_timestamp_seconds{{{SEL},watch="Node"}}': "0+60x40",
         f'modelgate_watch_last_progress_timestamp_seconds{{{SEL},watch="Node"}}': "0+60x40"},
        "25m", [],
    ),
    "a watch that never failed": case(
        "ModelgateWatchFailing",
        {f'modelgate_watch_last_failure_timestamp_seconds{{{SEL},watch="Node"}}': "0x40",
         f'modelgate_watch_last_progress_timestamp_seconds{{{SEL},watch="Node"}}': "0x40"},
        "25m", [],
    ),
    "the accept loop pauses at --max-connections, time and again": case(
        "ModelgateConnectionCapReached",
        {f"modelgate_accept_paused_total{{{SEL}}}": "0+3x40"},
        "15m", [{**WARN, "job": "modelgate", "namespace": NS}],
    ),
    "one pause in a burst, idle connections closed": case(
        "ModelgateConnectionCapReached",
        {f"modelgate_accept_paused_total{{{SEL}}}": "0x10 1x30",
         f'modelgate_connections_dropped_total{{{SEL},reason="idle_timeout"}}': "0+30x40"},
        "15m", [],  # pending since 11m: one pause's rate lasts 5 min, the alert needs more
    ),
    "slow senders cut time and again": case(
        "ModelgateSlowSendersCut",
        {f'modelgate_admission_errors_total{{{SEL},reason="body_too_slow"}}': "0+20x40"},
        "15m", [{**WARN, "job": "modelgate", "namespace": NS}],
    ),
    "one slow body cut, other errors rising": case(
        "ModelgateSlowSendersCut",
        {f'modelgate_admission_errors_total{{{SEL},reason="body_too_slow"}}': "0x10 1x30",
         f'modelgate_admission_errors_total{{{SEL},reason="deadline_exceeded"}}': "0+30x40"},
        "15m", [],  # pending since 11m: one cut's rate lasts 5 min, the alert needs more
    ),
    "an exception expires in 3 days (seen by two replicas)": case(
        "ModelgateExceptionExpiresSoon",
        {f'{EXPIRY}{{{SEL},instance="a",{VENDOR_ROOT}}}': "259200x40", f'{EXPIRY}{{{SEL},instance="b",{VENDOR_ROOT}}}': "259200x40"},
        "20m", [{**WARN, "job": "modelgate", "namespace": NS, "exported_namespace": "team-a", "name": "vendor-root"}],
    ),
    "an exception expires in 30 days": case(
        "ModelgateExceptionExpiresSoon",
        {f'{EXPIRY}{{{SEL},instance="a",{VENDOR_ROOT}}}': "2592000x40"},
        "20m", [],
    ),
    "the API server cannot call the mutating webhook": case(
        "ModelgateWebhookCallsFailing",
        {f'apiserver_admission_webhook_rejection_count{{{MUTATE_HOOK},error_type="calling_webhook_error",rejection_code="0"}}': "0+5x40"},
        "15m", [{**CRIT, "name": "mutate.modelgate.io", "type": "admit", "error_type": "calling_webhook_error"}],
    ),
    "the API server cannot call the controllers' webhook": case(
        "ModelgateWebhookCallsFailing",
        {f'apiserver_admission_webhook_rejection_count{{{CONTROLLERS_HOOK},error_type="calling_webhook_error",rejection_code="0"}}':
         "0+5x40"},
        "15m", [{**CRIT, "name": "validate-controllers.modelgate.io", "type": "validating", "error_type": "calling_webhook_error"}],
    ),
    "modelgate denies (no error) and another webhook fails": case(
        "ModelgateWebhookCallsFailing",
        {f'apiserver_admission_webhook_rejection_count{{{MUTATE_HOOK},error_type="no_error",rejection_code="403"}}': "0+5x40",
         'apiserver_admission_webhook_rejection_count{name="validate.kyverno.svc",type="validating",operation="CREATE",'
         'error_type="calling_webhook_error",rejection_code="0"}': "0+5x40"},
        "15m", [],
    ),
    "the API server fails open": case(
        "ModelgateWebhookFailingOpen",
        {'apiserver_admission_webhook_fail_open_count{name="validate.modelgate.io",type="validating"}': "0+1x40"},
        "15m", [{**WARN, "name": "validate.modelgate.io", "type": "validating"}],
    ),
    "another webhook fails open": case(
        "ModelgateWebhookFailingOpen",
        {'apiserver_admission_webhook_fail_open_count{name="validate.kyverno.svc",type="validating"}': "0+1x40",
         'apiserver_admission_webhook_fail_open_count{name="validate.modelgate.io",type="validating"}': "0x40"},
        "15m", [],
    ),
    "the API server sees the mutating webhook slow": case(
        "ModelgateWebhookSlowFromApiServer",
        histogram("apiserver_admission_webhook_admission_duration_seconds_bucket", f'{MUTATE_HOOK},rejected="false"', True),
        "20m", [{**WARN, "name": "mutate.modelgate.io", "type": "admit"}],
    ),
    "the API server sees the controllers' webhook slow": case(
        "ModelgateWebhookSlowFromApiServer",
        histogram("apiserver_admission_webhook_admission_duration_seconds_bucket", f'{CONTROLLERS_HOOK},rejected="false"', True),
        "20m", [{**WARN, "name": "validate-controllers.modelgate.io", "type": "validating"}],
    ),
    "the API server sees the mutating webhook fast": case(
        "ModelgateWebhookSlowFromApiServer",
        histogram("apiserver_admission_webhook_admission_duration_seconds_bucket", f'{MUTATE_HOOK},rejected="false"', False),
        "20m", [],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def rules_without_annotations(assets: Assets) -> Path:
    return assets.rules_for_tests("rules-for-tests", assets.render("rules", "--set", "monitoring.prometheusRule.enabled=true"))


def test_every_alert_has_a_firing_and_a_quiet_case(rules_without_annotations: Path) -> None:
    alerts = {r["alert"] for g in yaml.safe_load(rules_without_annotations.read_text())["groups"] for r in g["rules"]}
    firing = {c["alert_rule_test"][0]["alertname"] for c in CASES.values() if c["alert_rule_test"][0]["exp_alerts"]}
    quiet = {c["alert_rule_test"][0]["alertname"] for c in CASES.values() if not c["alert_rule_test"][0]["exp_alerts"]}
    assert firing == alerts, f"alerts without a firing case: {sorted(alerts - firing)}"
    assert quiet == alerts, f"alerts without a quiet case: {sorted(alerts - quiet)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_promtool_test_rules(assets: Assets, rules_without_annotations: Path, name: str) -> None:
    assets.promtool_test(rules_without_annotations, "alert-test-" + name, CASES[name])


def test_promtool_test_rules_can_fail(assets: Assets, rules_without_annotations: Path) -> None:
    """A healthy deployment expected to fire: promtool must report the mismatch."""
    wrong = case("ModelgateNoReadyReplica", {DEPLOY: "2x40", **UP}, "5m", [{**CRIT, "namespace": NS, "deployment": "modelgate"}])
    assert assets.promtool_test(rules_without_annotations, "alert-test-wrong", wrong, ok=False).returncode != 0
