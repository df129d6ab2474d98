"""The metric-name extractor the monitoring checks rely on."""

import pytest

from promql import grafana_to_promql, metric_names, variable_query_selector


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("up", {"up"}),
        ('sum by (job) (rate(a_total{job="x",le=~"0.5|1"}[5m])) / on(job) group_left(instance) b', {"a_total", "b"}),
        ('histogram_quantile(0.99, sum by (le) (rate(h_bucket{webhook="mutate"}[5m]))) > 2.5', {"h_bucket"}),
        ("g - time() < 14 * 86400 and 1e3 > bool 2", {"g"}),
        ('absent(up{job="m"} == 1) or kube_x{deployment="a b"} == 0', {"up", "kube_x"}),
        ("count_over_time(x[1h:5m]) unless y offset 5m", {"x", "y"}),
        ('z{name=~"(mutate|validate)\\\\.modelgate\\\\.io", error_type!="no_error"}', {"z"}),
        ("sum without (instance) (c:recorded:rate5m)", {"c:recorded:rate5m"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_grafana_variables() -> None:
    expr = 'rate(a{namespace="$namespace",job="${job}"}[$__rate_interval])'
    assert grafana_to_promql(expr, {"namespace": "ns", "job": "j"}) == 'rate(a{namespace="ns",job="j"}[1m])'
    assert variable_query_selector('label_values(m{namespace="$namespace"}, job)') == 'm{namespace="$namespace"}'
    assert variable_query_selector("query_result(up)") is None
