"""deploy/grafana: the dashboard parses, queries only metrics gpuevents exposes, and the scrape config is sane."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.metrics import DCGM_LABELS

GRAFANA = Path(__file__).resolve().parents[3] / "deploy" / "grafana"

DCGM_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
}
ENGINE_METRICS = {
    "gpuevents_held_idle_gpus", "gpuevents_waste_cost_total", "gpuevents_actions_total",
    "gpuevents_incidents", "gpuevents_events_consumed_total", "gpuevents_nodes_online",
    "gpuevents_event_to_action_seconds_bucket",
}
ENGINE_LABELS = {"type", "outcome", "state", "le"}
FUNCTIONS = {"sum", "avg", "max", "min", "count", "rate", "increase", "vector", "histogram_quantile"}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}


def _dashboard() -> dict[str, Any]:
    data = json.loads((GRAFANA / "gpuevents-dashboard.json").read_text())
    assert isinstance(data, dict)
    return data


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]


def parse_promql(expr: str) -> tuple[set[str], set[str], set[str]]:
    """(metrics, functions, label names) that a PromQL expression uses; enough for these queries."""
    labels: set[str] = set()
    for matchers in re.findall(r"\{([^}]*)\}", expr):
        labels.update(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", matchers))
    for grouping in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels.update(n.strip() for n in grouping.split(",") if n.strip())
    rest = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\"[^\"]*\"", " ", expr)
    rest = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", rest)
    functions: set[str] = set()
    names: set[str] = set()
    for name, call in re.findall(r"(?<![\w.$])([A-Za-z_:][\w:]*)(\s*\()?", rest):
        (functions if call else names).add(name)
    return names - KEYWORDS, functions, labels


def test_parse_promql_finds_metrics_functions_and_labels() -> None:
    metrics, functions, labels = parse_promql(
        'sum by (type, outcome) (increase(gpuevents_actions_total{rule=~"a|b"}[$__rate_interval])) * 3600')
    assert (metrics, functions, labels) == ({"gpuevents_actions_total"}, {"sum", "increase"},
                                            {"type", "outcome", "rule"})


def test_dashboard_json_parses_and_has_panels_with_queries() -> None:
    d = _dashboard()
    assert d["uid"] == "gpuevents-fleet"
    assert len(_exprs(d)) >= 15
    ids = [p["id"] for p in _panels(d)]
    assert len(ids) == len(set(ids))


def test_every_queried_metric_is_one_gpuevents_exposes() -> None:
    used: set[str] = set()
    for expr in _exprs(_dashboard()):
        metrics, functions, _ = parse_promql(expr)
        assert metrics, f"no metric in {expr!r}"
        unknown = metrics - DCGM_METRICS - ENGINE_METRICS
        assert not unknown, f"unknown metric in {expr!r}: {unknown}"
        assert functions <= FUNCTIONS, f"unexpected function in {expr!r}"
        used |= metrics
    assert used == DCGM_METRICS | ENGINE_METRICS  # every metric has a panel


def test_every_label_the_dashboard_uses_is_one_the_agent_or_engine_sets() -> None:
    d = _dashboard()
    for expr in _exprs(d):
        _, _, labels = parse_promql(expr)
        assert labels <= set(DCGM_LABELS) | ENGINE_LABELS, expr
    for p in _panels(d):
        for t in p.get("targets", []):
            assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}",
                                  t.get("legendFormat", ""))) <= set(DCGM_LABELS) | ENGINE_LABELS


@pytest.mark.parametrize("variable", ["hostname", "model"])
def test_template_variables_query_known_metric_labels(variable: str) -> None:
    var = next(v for v in _dashboard()["templating"]["list"] if v["name"] == variable)
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)",
                                 var["query"]["query"]).groups()  # type: ignore[union-attr]
    assert metric in DCGM_METRICS and label in DCGM_LABELS


def test_prometheus_config_scrapes_agent_and_engine() -> None:
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert {"gpuevents-agent", "gpuevents-engine", "gpuevents-k8s"} <= set(jobs)
    assert all(t.endswith(":9400") for t in jobs["gpuevents-agent"]["static_configs"][0]["targets"])
    assert all(t.endswith(":9500") for t in jobs["gpuevents-engine"]["static_configs"][0]["targets"])


def test_provisioning_files_parse() -> None:
    for name in ("dashboards.yaml", "datasources.yaml"):
        data = yaml.safe_load((GRAFANA / "provisioning" / name).read_text())
        assert data["apiVersion"] == 1
