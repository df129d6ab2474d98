"""The metric names a PromQL expression reads, and Grafana's variables replaced for evaluation.

Prometheus checks that an expression parses (its HTTP API answers bad_data otherwise); the
names are what it does not check: a query of a metric nobody exports parses and returns nothing.
"""

from __future__ import annotations

import re

KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan", "atan2", "start", "end",
}  # fmt: skip

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_DURATION = re.compile(r"(?<![\w:])(?:\d+(?:ms|[smhdwy]))+(?![\w:])")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Names of the vector selectors of expr (functions, keywords and label names excluded)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _LABEL_LIST.sub(" ", text)
    text = _DURATION.sub(" ", text)
    text = _NUMBER.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(0)
        following = text[m.end() :].lstrip()
        if word in KEYWORDS or following.startswith("("):
            continue
        names.add(word)
    return names


# Values for Grafana's variables when a dashboard query is sent to Prometheus.
GRAFANA_BUILTINS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "1h",
}


def grafana_to_promql(expr: str, variables: dict[str, str]) -> str:
    """Replaces Grafana's built-in and dashboard variables ($name and ${name})."""
    for k, v in GRAFANA_BUILTINS.items():
        expr = expr.replace(k, v)
    for k, v in variables.items():
        expr = expr.replace("${" + k + "}", v).replace("$" + k, v)
    return expr


_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$", re.S)


def variable_query_selector(query: str) -> str | None:
    """The series selector of a `label_values(selector, label)` variable query."""
    m = _LABEL_VALUES.match(query)
    return m.group(1) if m else None
