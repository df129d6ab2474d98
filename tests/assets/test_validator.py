"""The validators themselves can fail: a check that cannot fail checks nothing."""

import pytest

from tools import Assets

BAD = {
    "a bad value": """apiVersion: apps/v1
kind: Deployment
metadata: {name: x}
spec:
  replicas: two
  selector: {matchLabels: {a: b}}
  template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: i}]}}
""",
    "an unknown kind": "apiVersion: apps/v1\nkind: Deploymnet\nmetadata: {name: x}\n",
    "an unknown field (strict mode)": "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {portz: []}\n",
    "a ServiceMonitor with an unknown field (pinned CRD, strict)": """apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: x}
spec: {selector: {}, endpoints: [{port: http, intervall: 30s}]}
""",
    "a PrometheusRule whose rule lacks expr (pinned CRD)": """apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata: {name: x}
spec: {groups: [{name: g, rules: [{alert: A}]}]}
""",
}


@pytest.mark.parametrize("what", sorted(BAD))
def test_validate_refuses(assets: Assets, what: str) -> None:
    path = assets.work / ("bad-" + str(abs(hash(what))) + ".yaml")
    path.write_text(BAD[what])
    with pytest.raises(AssertionError):
        assets.validate(path)


def test_validate_accepts_a_good_service_monitor(assets: Assets) -> None:
    path = assets.work / "good-sm.yaml"
    path.write_text(
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: x}\n"
        "spec: {selector: {}, endpoints: [{port: http, interval: 30s}]}\n"
    )
    assert assets.validate(path) == 1
