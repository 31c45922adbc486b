"""The Grafana dashboard and docs/metrics.md against the metrics the exporter defines."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gpushare.monitor.collector import METRICS

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpushare-dashboard.json"
DOC = ROOT / "docs" / "metrics.md"
DEFINED = {spec.name for spec in METRICS}
KEYWORDS = {"and", "or", "unless", "bool", "offset"}
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # label values
    text = re.sub(r"\{[^}]*\}", "", text)  # matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = _LABEL_LISTS.sub("", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        if match.group(1) is None and match.group(0) not in KEYWORDS:
            names.add(match.group(0))
    return names


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", ())]


def test_the_parser_finds_metrics_and_skips_the_rest() -> None:
    expr = (
        'sum by (namespace, pod) (increase(a_total{x="b_c"}[5m])) / on(pod) group_left(node) '
        "b_bytes or vector(0) and bool offset"
    )
    assert metric_names(expr) == {"a_total", "b_bytes"}


def test_every_dashboard_expression_uses_only_exported_metrics() -> None:
    used: set[str] = set()
    for expr in expressions():
        names = metric_names(expr)
        assert names, expr
        assert names <= DEFINED, f"{expr}: unknown {names - DEFINED}"
        used |= names
    for variable in dashboard()["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            (name,) = re.findall(r"label_values\((\w+),", query["query"])
            assert name in DEFINED, name
    # The dashboard shows every metric but two about the monitor itself.
    assert DEFINED - used == {"gpushare_monitor_state_file_errors", "gpushare_monitor_pods_synced"}


def test_docs_list_every_dashboard_query() -> None:
    doc = DOC.read_text()
    for expr in expressions():
        assert expr in doc, f"docs/metrics.md does not list: {expr}"


def test_docs_describe_every_metric_and_no_other() -> None:
    doc = DOC.read_text()
    documented = set(re.findall(r"^\| `(gpushare_[a-z_]+)` \|", doc, re.M))
    assert documented == DEFINED
    for spec in METRICS:
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{spec.name}` |"))
        assert f"| {spec.kind} |" in row, spec.name
        for label in spec.labels:
            if label != "node":
                assert label in row, (spec.name, label)


def test_names_follow_prometheus_conventions() -> None:
    units = ("_bytes", "_ratio", "_celsius", "_watts", "_seconds", "_total")
    for spec in METRICS:
        assert spec.name.startswith("gpushare_"), spec.name
        assert spec.name.endswith("_total") == (spec.kind == "counter"), spec.name
        if spec.help.startswith("1 "):
            continue  # a 0/1 state: no unit
        if "memory" in spec.name or "utilization" in spec.name:
            assert spec.name.endswith(units), spec.name
