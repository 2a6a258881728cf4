"""The chart's autoscaling values render what a resource's spec.autoscaling needs in the
cluster: a PodMonitor that scrapes exactly the operator's serving pods, and a Prometheus
Adapter configuration serving every metric the operator's HorizontalPodAutoscaler can read."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from minicpm_speech_operator import autoscaling

from tests.chart.rendering import (
    KUBE_VERSION,
    RELEASE_NAMESPACE,
    REPO_ROOT,
    VALUE_SETS,
    find,
    only,
    render_notes,
    render_objects,
)
from tests.controller.builders import claim_spec
from tests.controller.test_manifests import render as render_children

INTEGRATION = VALUE_SETS["autoscaling-integration"]


def serving_pod() -> dict[str, Any]:
    """The pod template of the Deployment the operator renders for an autoscaled resource."""
    spec = {**claim_spec(), "autoscaling": {"enabled": True, "maxReplicas": 4, "target": 8}}
    deployment = render_children(spec)["Deployment"]
    template: dict[str, Any] = deployment["spec"]["template"]
    return template


def adapter_rules(values: dict[str, Any]) -> list[dict[str, Any]]:
    configmap = only(render_objects(values), "ConfigMap")
    config = yaml.safe_load(configmap["data"]["config.yaml"])
    assert set(config) == {"rules"}, "nothing but the rules: the adapter's own config is its"
    rules: list[dict[str, Any]] = config["rules"]
    return rules


def series_names(rules: list[dict[str, Any]]) -> set[str]:
    """The metric each rule's series query asks Prometheus for."""
    names = {rule["seriesQuery"].split("{", 1)[0] for rule in rules}
    assert len(names) == len(rules), "one rule per metric"
    return names


def readme_rules() -> list[dict[str, Any]]:
    """The rules the top-level README shows, for an adapter that serves other metrics too."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```yaml\n(rules:\n.*?)```", readme, flags=re.S)
    assert len(blocks) == 1, "one block of adapter rules in the README"
    rules: list[dict[str, Any]] = yaml.safe_load(blocks[0])["rules"]
    return rules


def test_by_default_the_chart_renders_neither() -> None:
    objects = render_objects()
    assert find(objects, "PodMonitor") == []
    assert find(objects, "ConfigMap") == []


@pytest.mark.parametrize("value_set", ["autoscaling-integration", "everything"])
def test_the_pod_monitor_selects_the_operators_serving_pods_on_their_metrics_port(
        value_set: str) -> None:
    objects = render_objects(VALUE_SETS[value_set])
    monitor = only(objects, "PodMonitor")
    assert monitor["metadata"]["namespace"] == RELEASE_NAMESPACE
    pod = serving_pod()
    labels = pod["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items(), "the monitor selects the serving pods"
    # ... and nothing else the operator runs: a benchmark Job's pod is not a server.
    assert "app.kubernetes.io/instance" not in selector, "every resource's pods, not one"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"


def test_the_pod_monitor_looks_in_the_watched_namespaces() -> None:
    monitor = only(render_objects(INTEGRATION), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["speech-a", "speech-b"]}
    wide = only(render_objects(VALUE_SETS["everything"]), "PodMonitor")
    assert wide["spec"]["namespaceSelector"] == {"any": True}
    assert wide["metadata"]["labels"]["release"] == "prom"
    alone = {"autoscaling": {"podMonitor": {"enabled": True}}}
    own = only(render_objects(alone), "PodMonitor")
    assert own["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}


def test_the_adapter_rules_serve_every_metric_the_autoscaler_can_read() -> None:
    configmap = only(render_objects(INTEGRATION), "ConfigMap")
    assert kubernetes_validate.validate(configmap, KUBE_VERSION, strict=True) == KUBE_VERSION
    assert configmap["metadata"]["namespace"] == "monitoring"
    rules = adapter_rules(INTEGRATION)
    served = series_names(rules)
    assert served == {metric.name for metric in autoscaling.POD_METRICS.values()}
    for rule in rules:
        # One value per pod: the HPA averages pods itself, so the rule must not sum them.
        assert rule["resources"] == {"overrides": {"namespace": {"resource": "namespace"},
                                                   "pod": {"resource": "pod"}}}
        assert "<<.GroupBy>>" in rule["metricsQuery"]


def test_the_readme_shows_the_rules_the_chart_renders() -> None:
    assert readme_rules() == adapter_rules(INTEGRATION)


def test_the_hpa_asks_for_metrics_the_adapter_serves() -> None:
    served = series_names(adapter_rules(INTEGRATION))
    for metric in sorted(autoscaling.POD_METRICS):
        target = 1.5 if metric == "realTimeMargin" else 8
        spec = {**claim_spec(), "autoscaling": {"enabled": True, "maxReplicas": 4,
                                                "target": target, "metric": metric}}
        hpa = render_children(spec)["HorizontalPodAutoscaler"]
        assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] in served, metric


def test_adapter_rules_without_a_namespace_are_refused_naming_the_value() -> None:
    values = {"autoscaling": {"prometheusAdapter": {"rules": {"enabled": True}}}}
    with pytest.raises(helm.HelmValuesError, match="namespace"):
        render_objects(values)


def test_the_install_notes_give_the_adapter_command_for_the_rendered_rules() -> None:
    notes = render_notes(INTEGRATION)
    configmap = only(render_objects(INTEGRATION), "ConfigMap")["metadata"]
    assert (f"prometheus-community/prometheus-adapter -n {configmap['namespace']}" in notes
            and f"--set rules.existing={configmap['name']}" in notes), notes
    # Offline (and on a cluster without the Prometheus Operator) the PodMonitor cannot apply.
    assert notes.lstrip().startswith("WARNING: autoscaling.podMonitor.enabled is true")
    assert "prometheus-adapter" not in render_notes()
