"""Every value set renders, lints clean and is valid Kubernetes (strict, 1.33 schemas)."""

from __future__ import annotations

import copy
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from tests.chart.rendering import (
    CHART_DIR,
    KUBE_VERSION,
    RELEASE_NAMESPACE,
    VALUE_SETS,
    find,
    load_crd,
    render_objects,
)

# The Prometheus Operator's CRDs are not part of the Kubernetes OpenAPI that
# kubernetes-validate ships, so they are checked here by shape, for the fields the chart sets.
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h))+$"}


def _monitor_shape(kind: str, endpoints_key: str) -> dict[str, Any]:
    """A ServiceMonitor or PodMonitor: the two differ in the name of their endpoint list."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "namespace"],
                "properties": {
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                    "labels": _LABELS,
                },
            },
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["selector", endpoints_key],
                "properties": {
                    "selector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"matchLabels": _LABELS},
                    },
                    "namespaceSelector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "any": {"type": "boolean"},
                            "matchNames": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    endpoints_key: {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "required": ["port"],
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "interval": _DURATION,
                                "scrapeTimeout": _DURATION,
                            },
                        },
                    },
                },
            },
        },
    }


MONITOR_SHAPES: dict[str, dict[str, Any]] = {
    "ServiceMonitor": _monitor_shape("ServiceMonitor", "endpoints"),
    "PodMonitor": _monitor_shape("PodMonitor", "podMetricsEndpoints"),
}


def validate_object(obj: dict[str, Any]) -> None:
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        jsonschema.Draft7Validator(MONITOR_SHAPES[obj["kind"]]).validate(obj)
    else:
        assert kubernetes_validate.validate(obj, KUBE_VERSION, strict=True) == KUBE_VERSION


def test_kubernetes_validate_ships_the_pinned_version() -> None:
    assert f"{KUBE_VERSION}.0" in all_versions()


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_rendered_object_is_valid_kubernetes(value_set: str) -> None:
    objects = render_objects(VALUE_SETS[value_set])
    assert objects
    for obj in objects:
        validate_object(obj)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_lint_has_no_errors_or_warnings(value_set: str) -> None:
    report = helm.lint(
        CHART_DIR,
        VALUE_SETS[value_set],
        strict=True,
        namespace=RELEASE_NAMESPACE,
        kube_version=f"v{KUBE_VERSION}.0",
    )
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_namespaced_objects_are_in_a_namespace(value_set: str) -> None:
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding"}
    for obj in render_objects(VALUE_SETS[value_set]):
        has_namespace = "namespace" in obj["metadata"]
        assert has_namespace != (obj["kind"] in cluster_scoped), obj["metadata"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_object_identities_are_unique(value_set: str) -> None:
    ids = [
        (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
        for o in render_objects(VALUE_SETS[value_set])
    ]
    assert len(ids) == len(set(ids))


def test_the_crd_is_valid_kubernetes() -> None:
    assert kubernetes_validate.validate(load_crd(), KUBE_VERSION, strict=True) == KUBE_VERSION


def test_the_chart_ships_the_crd_file_itself() -> None:
    (crd,) = helm.Chart.load(CHART_DIR).crds
    assert crd["filename"].endswith("minicpmspeeches.serving.minicpm-speech.io.yaml")


def test_strict_validation_catches_a_misspelt_field() -> None:
    deployment = copy.deepcopy(find(render_objects(), "Deployment")[0])
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_object(deployment)


def test_service_monitor_shape_catches_a_misspelt_field() -> None:
    values = VALUE_SETS["metrics-servicemonitor"]
    monitor = copy.deepcopy(find(render_objects(values), "ServiceMonitor")[0])
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(monitor)


def test_pod_monitor_shape_catches_a_misspelt_field() -> None:
    monitor = copy.deepcopy(find(render_objects(VALUE_SETS["autoscaling-integration"]),
                                 "PodMonitor")[0])
    validate_object(monitor)
    monitor["spec"]["podMetricsEndpoints"][0]["prot"] = "health"
    with pytest.raises(jsonschema.ValidationError):
        validate_object(monitor)
