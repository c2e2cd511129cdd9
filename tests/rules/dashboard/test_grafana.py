"""deploy/grafana: the dashboard parses, queries only metrics gpuevents exposes, the scrape config is sane, and every
panel returns series from a real Prometheus scraping `gpuevents up --demo`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.dcgm import DCGM_OPTIONAL_LABELS
from agent.metrics import DCGM_LABELS
from tests.prometheus import PrometheusServer, free_port

GRAFANA = Path(__file__).resolve().parents[3] / "deploy" / "grafana"

DCGM_METRICS = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
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
        assert labels <= set(DCGM_LABELS) | set(DCGM_OPTIONAL_LABELS) | ENGINE_LABELS, expr
    for p in _panels(d):
        for t in p.get("targets", []):
            assert set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", ""))) <= (
                set(DCGM_LABELS) | set(DCGM_OPTIONAL_LABELS) | ENGINE_LABELS)


@pytest.mark.parametrize("variable", ["hostname", "model"])
def test_template_variables_query_known_metric_labels(variable: str) -> None:
    var = next(v for v in _dashboard()["templating"]["list"] if v["name"] == variable)
    m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["query"]["query"])
    assert m is not None, var
    metric, label = m.groups()
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


# ---------------------------------------------------------------- against a real Prometheus
GRAFANA_VARIABLES = {"hostname": ".+", "model": ".+", "__range": "5m", "__rate_interval": "15s"}


def _as_grafana_sends_it(expr: str) -> str:
    out = re.sub(r"\$(\w+)", lambda m: GRAFANA_VARIABLES[m.group(1)], expr)
    assert "$" not in out, out
    return out


@pytest.fixture
def demo_scraped(tmp_path: Path) -> Iterator[PrometheusServer]:
    """`gpuevents up --demo` with the agent's and the engine's /metrics on, scraped every second by Prometheus."""
    agent_port, engine_port = free_port(), free_port()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"nats:\n  embedded:\n    port: 0\nengine:\n  dashboard_port: 0\n  metrics_port: {engine_port}\n"
                   f"agent:\n  metrics_port: {agent_port}\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SLACK_BOT_TOKEN", None)
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "gpuevents.cli", "up", "--demo", "-c", str(cfg)],
                            cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with PrometheusServer.running(tmp_path / "prometheus", {
            "gpuevents-agent": [f"127.0.0.1:{agent_port}"], "gpuevents-engine": [f"127.0.0.1:{engine_port}"],
        }) as prom:
            yield prom
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.mark.slow
def test_every_panel_returns_series_from_a_real_prometheus(demo_scraped: PrometheusServer) -> None:
    prom = demo_scraped
    # the demo's idle rule fires within a minute; then every engine series has values over two scrapes
    prom.wait_for_series("increase(gpuevents_actions_total[5m]) > 0", timeout=120)
    prom.wait_for_series("increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m]) > 0", timeout=30)
    d = _dashboard()
    for var in d["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["query"]["query"])
            assert m is not None, var
            metric, label = m.groups()
            assert prom.api(f"label/{label}/values", **{"match[]": metric}), var["name"]
    checked = 0
    for p in _panels(d):
        for t in p.get("targets", []):
            result = prom.query(_as_grafana_sends_it(t["expr"]))
            assert result, f"panel {p['title']!r}: {t['expr']} returned nothing"
            # the labels the legend shows must be on every series (a MIG instance's are there only for one)
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
            required = legend - set(DCGM_OPTIONAL_LABELS)
            for r in result:
                assert required <= set(r["metric"]), (p["title"], r["metric"])
            checked += 1
    assert checked == len(_exprs(d))
    gpus = prom.query('count(count by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL{Hostname=~".+"}))')
    assert gpus[0]["value"][1] == "8"  # the demo's simulated node
