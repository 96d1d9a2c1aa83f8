"""deploy/grafana and deploy/prometheus: every metric they use is one a real daemon exports (with
the labels it has), and every expression parses as PromQL; promtool checks and unit-tests the
rules where it is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .daemonkit import client, run_to_done, running_daemon

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "execbox-runner.json"
RULES = DEPLOY / "prometheus" / "execbox-runner-rules.yaml"
RULE_TESTS = DEPLOY / "prometheus" / "execbox-runner-rules.test.yaml"
# What Prometheus itself makes per target, and the labels it attaches to every series.
PROMETHEUS_SERIES = {"up"}
TARGET_LABELS = {"job", "instance", "__name__"}
# The sample names a family of each type shows in the text format.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
    "unknown": ("",),
}
# Grafana's variables, replaced by what they stand for in a query Prometheus gets.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$job": "execbox-runner"}


def scrape(url: str) -> str:
    with urllib.request.urlopen(url.replace("ws://", "http://").rstrip("/") + "/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
        return text


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Sample name -> label names, from a real daemon's /metrics after executions that end ok,
    with an error and with a timeout, a tool call, a refused handshake, retired workers (one
    execution each) and a tenant's CPU (sampled once a second), so every labelled family has
    samples."""
    with running_daemon("--tokens", "dashboard-token", "--max-executions-per-worker", "1") as daemon:
        headers = {"Authorization": "Bearer dashboard-token"}
        with client(daemon.url, additional_headers=headers) as ws:
            assert run_to_done(ws, "ok", "await tools.echo(1)")["ok"] is True
        with client(daemon.url, additional_headers=headers) as ws:
            assert run_to_done(ws, "error", "throw new Error('no')")["ok"] is False
        with client(daemon.url, additional_headers=headers) as ws:
            done = run_to_done(ws, "spin", "while (true) {}", timeoutMs=200)
            assert done["error"]["code"] == "timeout"
        with pytest.raises(Exception, match="401"):
            client(daemon.url)
        text = scrape(daemon.url)
    samples: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            samples.setdefault(family.name + suffix, set())
        for sample in family.samples:
            samples.setdefault(sample.name, set()).update(sample.labels)
    return samples


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())

    def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            yield item
            yield from panels(item.get("panels", []))

    queries = [target["expr"] for panel in panels(dashboard["panels"]) for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found = re.fullmatch(r"label_values\((.+), *(\w+)\)", variable["query"]["query"])
            assert found, variable["query"]["query"]
            queries.append(found.group(1))
    return queries


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def grafana_to_promql(query: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    return query.replace('=~"$instance"', '=~".*"')


def selectors(node: Any) -> Iterator[promql_parser.VectorSelector]:
    """Every vector selector in a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node
        return
    if isinstance(node, promql_parser.MatrixSelector):
        yield node.vector_selector
        return
    for child in ("expr", "lhs", "rhs", "param"):
        if hasattr(node, child) and getattr(node, child) is not None:
            yield from selectors(getattr(node, child))
    for argument in getattr(node, "args", None) or []:
        yield from selectors(argument)


def used(query: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names in its matchers) for every selector of ``query``."""
    found = []
    for selector in selectors(promql_parser.parse(grafana_to_promql(query))):
        matchers = selector.matchers.matchers
        name = selector.name or next(m.value for m in matchers if m.name == "__name__")
        found.append((name, {m.name for m in matchers}))
    return found


def grouped(node: Any) -> Iterator[tuple[set[str], set[str]]]:
    """(labels of a ``by`` clause, the metric names it groups) for every aggregation of a parsed
    expression: a label summed by must be one the grouped series carry."""
    modifier = getattr(node, "modifier", None) if isinstance(node, promql_parser.AggregateExpr) else None
    if modifier is not None and modifier.type == promql_parser.AggModifierType.By:
        yield set(modifier.labels), {selector.name for selector in selectors(node.expr)}
    for child in ("expr", "lhs", "rhs", "param"):
        if getattr(node, child, None) is not None:
            yield from grouped(getattr(node, child))
    for argument in getattr(node, "args", None) or []:
        yield from grouped(argument)


def recorded() -> set[str]:
    return {rule["record"] for rule in rules() if "record" in rule}


def test_every_query_parses_and_uses_only_exported_metrics_and_labels(exported: dict[str, set[str]]) -> None:
    queries = dashboard_queries() + [rule["expr"] for rule in rules()]
    assert len(queries) > 30
    names = set()
    for query in queries:
        for name, labels in used(query):
            names.add(name)
            if name in recorded():
                continue
            assert name in exported or name in PROMETHEUS_SERIES, f"{name} is not exported by the daemon (in {query!r})"
            if name in exported:
                assert labels - TARGET_LABELS <= exported[name], f"{name} has no label {labels - exported[name]}"
        for labels, grouped_names in grouped(promql_parser.parse(grafana_to_promql(query))):
            for name in grouped_names & set(exported):
                assert labels - TARGET_LABELS <= exported[name], f"{name} has no label {labels - exported[name]}"
    # Everything an operator watches is on the dashboard or in an alert.
    watched = {
        "execbox_active_sessions",
        "execbox_max_sessions",
        "execbox_executions_total",
        "execbox_execution_duration_seconds_bucket",
        "execbox_tool_call_duration_seconds_bucket",
        "execbox_pool_workers",
        "execbox_worker_restarts_total",
        "execbox_rejected_handshakes_total",
        "execbox_memory_used_bytes",
        "execbox_memory_budget_bytes",
        "execbox_unsafe_settings",
        "execbox_draining",
        "execbox_tenant_executions_total",
        "execbox_tenant_cpu_seconds_total",
        "execbox_worker_exits_total",
        "up",
    }
    assert watched <= names


def test_the_checker_refuses_what_the_daemon_does_not_export(exported: dict[str, set[str]]) -> None:
    # The counter's family is execbox_executions, its samples execbox_executions_total: the bare
    # family name is not a series, nor is a histogram without its suffix.
    for wrong in ("execbox_executions", "execbox_execution_duration_seconds", "execbox_active_session"):
        assert wrong not in exported
    assert "outcome" in exported["execbox_executions_total"]
    assert "code" in exported["execbox_executions_total"]
    assert "setting" in exported["execbox_unsafe_settings"]
    (by_typo,) = grouped(promql_parser.parse("sum by (tenant, outcom) (rate(execbox_tenant_executions_total[5m]))"))
    assert by_typo == ({"tenant", "outcom"}, {"execbox_tenant_executions_total"})
    assert not by_typo[0] <= exported["execbox_tenant_executions_total"]
    with pytest.raises(ValueError):
        promql_parser.parse("sum(rate(execbox_executions_total[5m])")


def test_label_values_in_matchers_are_ones_the_daemon_uses() -> None:
    known = {
        "outcome": {"ok", "error", "abandoned"},
        "code": {"timeout", "memory_limit", "internal_error", "tool_error", "runtime_error", ""},
        "setting": {"sandbox_off", "no_authentication", "no_tls", "no_network_namespace"},
        "reason": {"unauthorized", "origin", "draining", "busy", "memory", "worker_crash"},
        "state": {"idle", "busy", "starting"},
    }
    for query in dashboard_queries() + [rule["expr"] for rule in rules()]:
        for selector in selectors(promql_parser.parse(grafana_to_promql(query))):
            for matcher in selector.matchers.matchers:
                if matcher.name in known:
                    values = set(matcher.value.split("|"))
                    assert values <= known[matcher.name], (query, matcher.value)


def test_the_rules_are_well_formed() -> None:
    loaded = yaml.safe_load(RULES.read_text())
    assert {group["name"] for group in loaded["groups"]} == {"execbox-runner.recording", "execbox-runner.alerts"}
    alerts = [rule for rule in rules() if "alert" in rule]
    assert {rule["alert"] for rule in alerts} >= {
        "ExecboxRunnerDown",
        "ExecboxInternalErrors",
        "ExecboxErrorRateSpike",
        "ExecboxTimeoutRateSpike",
        "ExecboxSessionsNearMaximum",
        "ExecboxRefusingSessions",
        "ExecboxMemoryNearBudget",
        "ExecboxWorkerRestartStorm",
        "ExecboxWorkerCrashed",
        "ExecboxUnsafeSetting",
        "ExecboxLogLinesDropped",
    }
    for rule in alerts:
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert set(rule["annotations"]) >= {"summary", "description"}, rule["alert"]
    for rule in rules():
        if "record" in rule:
            assert re.fullmatch(r"\w+:\w+:\w+", rule["record"]), rule["record"]  # level:metric:operations


def test_the_sessions_alert_compares_with_the_maximum_the_daemon_exports() -> None:
    """No ceiling is written into the rule: it reads each runner's own, whatever sized it."""
    (rule,) = [rule for rule in rules() if rule.get("alert") == "ExecboxSessionsNearMaximum"]
    assert {name for name, _ in used(rule["expr"])} == {"execbox_active_sessions", "execbox_max_sessions"}
    assert not re.search(r"\d{3,}", rule["expr"])


def test_the_dashboard_is_importable_grafana_json() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "execbox-runner" and dashboard["schemaVersion"] >= 36
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert variables == {"datasource", "job", "instance"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed (Debian/Ubuntu: apt-get install prometheus; .ci/run installs it)")
    return found


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_the_alerts() -> None:
    """Each alert fires on the series that should fire it, and not on a hardened runner's restarts."""
    done = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_checks_the_dashboard_queries(tmp_path: Path) -> None:
    queries = dashboard_queries()
    as_rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}:check", "expr": grafana_to_promql(q)}
                    for i, q in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump(as_rules))
    done = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
