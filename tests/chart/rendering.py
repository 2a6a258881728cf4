"""Render the chart with the real Helm engine (helm-python-sdk), offline.

Rendering also validates the values against values.schema.json, exactly as
`helm install` does, and raises helm_python.HelmValuesError when they do not fit.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "minicpm-speech-operator"
CRD_PATH = CHART_DIR / "crds" / "minicpmspeeches.serving.minicpm-speech.io.yaml"
EXAMPLES_DIR = REPO_ROOT / "examples"

RELEASE_NAME = "minicpm-speech-operator"
RELEASE_NAMESPACE = "minicpm-speech"
KUBE_VERSION = "1.33"
NOTES = "NOTES.txt"

# The value sets every structural test runs against: the default install and the
# shapes a production user picks.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "default": {},
    "namespaced-two": {"watch": {"namespaces": ["speech-a", "speech-b"]}},
    "cluster-wide": {"watch": {"clusterWide": True}},
    "metrics-servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "replicas-two": {"replicas": 2},
    "autoscaling-integration": {
        "watch": {"namespaces": ["speech-a", "speech-b"]},
        "autoscaling": {
            "podMonitor": {"enabled": True},
            "prometheusAdapter": {"rules": {"enabled": True, "namespace": "monitoring"}},
        },
    },
    "everything": {
        "replicas": 3,
        "watch": {"clusterWide": True},
        "image": {"digest": "sha256:" + "ab" * 32},
        "imagePullSecrets": [{"name": "registry"}],
        "serviceAccount": {"annotations": {"example.com/role": "operator"}},
        "podAnnotations": {"example.com/scrape": "true"},
        "podLabels": {"team": "speech"},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
        ],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {
                                "matchLabels": {"app.kubernetes.io/component": "operator"}
                            },
                        },
                    }
                ]
            }
        },
        "priorityClassName": "system-cluster-critical",
        "extraArgs": ["--log-level=DEBUG"],
        "metrics": {
            "service": {"annotations": {"prometheus.io/scrape": "true"}},
            "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}},
        },
        "autoscaling": {
            "podMonitor": {"enabled": True, "interval": "30s", "labels": {"release": "prom"}},
            "prometheusAdapter": {"rules": {"enabled": True, "namespace": "monitoring"}},
        },
    },
}


@functools.lru_cache(maxsize=1)
def chart() -> helm.Chart:
    """The loaded chart, shared by every test (charts are immutable)."""
    return helm.Chart.load(CHART_DIR)


@functools.lru_cache(maxsize=64)
def _render(values_json: str, namespace: str) -> dict[str, str]:
    return chart().render(
        values=json.loads(values_json),
        name=RELEASE_NAME,
        namespace=namespace,
        is_install=True,
    )


def render(
    values: dict[str, Any] | None = None, namespace: str = RELEASE_NAMESPACE
) -> dict[str, str]:
    """Template path (e.g. ``templates/operator-deployment.yaml``) -> rendered text."""
    rendered = _render(json.dumps(values or {}, sort_keys=True), namespace)
    prefix = f"{chart().name}/"
    return {path.removeprefix(prefix): text for path, text in rendered.items()}


def render_objects(
    values: dict[str, Any] | None = None, namespace: str = RELEASE_NAMESPACE
) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders, in template-path order."""
    objects: list[dict[str, Any]] = []
    for path, text in sorted(render(values, namespace).items()):
        if path.endswith(NOTES):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def render_notes(values: dict[str, Any] | None = None) -> str:
    return render(values)[f"templates/{NOTES}"]


def find(
    objects: list[dict[str, Any]], kind: str, name: str | None = None, namespace: str | None = None
) -> list[dict[str, Any]]:
    return [
        obj
        for obj in objects
        if obj["kind"] == kind
        and (name is None or obj["metadata"]["name"] == name)
        and (namespace is None or obj["metadata"].get("namespace") == namespace)
    ]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = find(objects, kind)
    return found


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def load_crd() -> dict[str, Any]:
    with CRD_PATH.open() as f:
        crd: dict[str, Any] = yaml.safe_load(f)
    return crd


def load_values_yaml() -> dict[str, Any]:
    with (CHART_DIR / "values.yaml").open() as f:
        values: dict[str, Any] = yaml.safe_load(f)
    return values


def load_values_schema() -> dict[str, Any]:
    with (CHART_DIR / "values.schema.json").open() as f:
        schema: dict[str, Any] = json.load(f)
    return schema
