"""deploy/grafana/streamfeed.json is an importable dashboard: valid JSON,
a datasource variable every panel uses, titled panels on a 24-column grid,
and PromQL that parses and reads only streamfeed's metrics (and `up`)."""

from __future__ import annotations

import json
import re

import pytest

from opshelpers import REPO, exported_metrics, metric_names

DASHBOARD = REPO / "deploy" / "grafana" / "streamfeed.json"

# The metrics the dashboard is specified to show, plus Prometheus' `up`.
ALLOWED = {
    "streamfeed_received_bytes_total",
    "streamfeed_steps_total",
    "streamfeed_samples_trained_total",
    "streamfeed_loss",
    "streamfeed_ring_slots",
    "streamfeed_queue_wait_seconds_bucket",
    "streamfeed_h2d_seconds_bucket",
    "streamfeed_transform_seconds_bucket",
    "streamfeed_step_seconds_bucket",
    "streamfeed_compute_busy_ratio",
    "streamfeed_batches_rejected_total",
    "streamfeed_http_requests_total",
    "up",
}
REQUIRED = ALLOWED - {"up"}
GRAFANA_RANGE_VARS = re.compile(r"\$\{?__(rate_interval|interval|range)\}?")


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(dashboard):
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])  # panels inside collapsed rows


def queries(dashboard):
    for p in all_panels(dashboard):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", q)
            yield f"variable {v['name']}", m.group(1) if m else q


def promql(expr: str) -> str:
    """Grafana's range variables as a literal duration, so the parser accepts them."""
    return GRAFANA_RANGE_VARS.sub("5m", expr)


def test_dashboard_metadata(dashboard):
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]


def test_datasource_is_a_prometheus_variable_used_everywhere(dashboard):
    ds = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert len(ds) == 1 and ds[0]["query"] == "prometheus"
    ref = {"type": "prometheus", "uid": "${%s}" % ds[0]["name"]}
    for p in all_panels(dashboard):
        if p["type"] == "row":
            continue
        assert p["datasource"] == ref, p["title"]
        for t in p["targets"]:
            assert t.get("datasource", ref) == ref, p["title"]


def test_panels_have_titles_unique_ids_and_fit_the_grid(dashboard):
    ids = []
    for p in all_panels(dashboard):
        assert p.get("title", "").strip(), f"panel {p.get('id')} has no title"
        ids.append(p["id"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p.get("targets"), f"{p['title']} has no query"
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_expression_parses_and_reads_only_the_listed_metrics(dashboard):
    seen = set()
    for where, expr in queries(dashboard):
        names = metric_names(promql(expr))
        assert names, f"{where}: {expr!r} reads no metric"
        unknown = names - ALLOWED
        assert not unknown, f"{where}: unknown metrics {unknown}"
        seen |= names
    assert REQUIRED <= seen, f"metrics with no panel: {REQUIRED - seen}"
    missing = seen - exported_metrics() - {"up"}
    assert not missing, f"the dashboard shows metrics the server does not export: {missing}"


def test_latency_panels_are_heatmaps_of_histogram_buckets(dashboard):
    heatmaps = [p for p in all_panels(dashboard) if p["type"] == "heatmap"]
    buckets = set()
    for p in heatmaps:
        for t in p["targets"]:
            assert t.get("format") == "heatmap", p["title"]
            assert "by (le)" in t["expr"].replace("  ", " "), p["title"]
            buckets |= metric_names(promql(t["expr"]))
    assert buckets == {m for m in ALLOWED if m.endswith("_bucket")}


def test_counters_are_shown_as_rates(dashboard):
    for where, expr in queries(dashboard):
        if where.startswith("variable"):
            continue
        for name in metric_names(promql(expr)):
            if name.endswith(("_total", "_bucket")):
                assert re.search(r"\b(rate|irate|increase)\(\s*" + name, expr), f"{where}: {name} not rated"
