"""values.schema.json refuses bad values, naming the key; values.yaml is complete and documented."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import pytest

from tests.chart.rendering import (
    CHART_DIR,
    chart,
    load_values_schema,
    load_values_yaml,
    render,
)

# (values, text the error must contain: the JSON pointer of the key, then the reason)
BAD_VALUES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "negative replicas": ({"replicas": -1}, ["/replicas", "minimum"]),
    "replicas as a string": ({"replicas": "two"}, ["/replicas", "integer"]),
    "fractional replicas": ({"replicas": 1.5}, ["/replicas"]),
    "unknown top-level key": ({"replica": 2}, ["additional properties 'replica'"]),
    "unknown nested key": ({"image": {"tags": "1.0"}}, ["/image", "'tags'"]),
    "pull policy not in the enum": (
        {"image": {"pullPolicy": "Sometimes"}},
        ["/image/pullPolicy", "Always"],
    ),
    "digest without algorithm": ({"image": {"digest": "abc123"}}, ["/image/digest"]),
    "namespaces as a string": ({"watch": {"namespaces": "speech"}}, ["/watch/namespaces", "array"]),
    "namespace not a DNS label": ({"watch": {"namespaces": ["Speech_A"]}}, ["/watch/namespaces/0"]),
    "duplicate namespaces": ({"watch": {"namespaces": ["a", "a"]}}, ["/watch/namespaces"]),
    "namespaces with clusterWide": (
        {"watch": {"clusterWide": True, "namespaces": ["a"]}},
        ["/watch/namespaces", "maxItems"],
    ),
    "clusterWide as a string": (
        {"watch": {"clusterWide": "yes"}},
        ["/watch/clusterWide", "boolean"],
    ),
    "privileged metrics port": ({"metrics": {"port": 80}}, ["/metrics/port", "minimum"]),
    "port out of range": ({"health": {"port": 70000}}, ["/health/port", "maximum"]),
    "bad scrape interval": (
        {"metrics": {"serviceMonitor": {"interval": "30 seconds"}}},
        ["/metrics/serviceMonitor/interval"],
    ),
    "ServiceMonitor without the Service": (
        {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}},
        ["/metrics/service/enabled"],
    ),
    "root user": (
        {"podSecurityContext": {"runAsUser": 0}},
        ["/podSecurityContext/runAsUser", "minimum"],
    ),
    "unknown resource": ({"resources": {"requests": {"gpu": 1}}}, ["/resources/requests", "'gpu'"]),
    "bad memory quantity": (
        {"resources": {"limits": {"memory": "lots"}}},
        ["/resources/limits/memory"],
    ),
    "toleration typo": (
        {"tolerations": [{"key": "a", "effect": "NoSchedul"}]},
        ["/tolerations/0/effect"],
    ),
    "label value not a string": ({"podLabels": {"tier": 1}}, ["/podLabels/tier", "string"]),
    "a required block set to null": ({"image": None}, ["missing property 'image'"]),
    "a required key set to null": (
        {"image": {"repository": None}},
        ["/image", "missing property 'repository'"],
    ),
    "extraArgs as a string": ({"extraArgs": "--verbose"}, ["/extraArgs", "array"]),
}


@pytest.mark.parametrize("case", BAD_VALUES)
def test_bad_values_are_refused_naming_the_key(case: str) -> None:
    values, expected = BAD_VALUES[case]
    with pytest.raises(helm.HelmValuesError) as refused:
        chart().render(values=values, name="x", namespace="x")
    message = str(refused.value)
    for text in expected:
        assert text in message, message


def test_lint_reports_a_typo_as_an_error() -> None:
    report = helm.lint(CHART_DIR, {"replica": 2})
    assert any("replica" in m["error"] and m["severity"] == 3 for m in report["messages"])


def test_default_values_pass_the_schema() -> None:
    chart().validate_schema(load_values_yaml())


def _walk_schema(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for key, child in schema.get("properties", {}).items():
        found += _walk_schema(child, f"{path}/{key}")
    if isinstance(schema.get("items"), dict):
        found += _walk_schema(schema["items"], f"{path}/*")
    return found


def test_every_schema_object_refuses_unknown_keys() -> None:
    free_form = {"/affinity/nodeAffinity", "/affinity/podAffinity", "/affinity/podAntiAffinity"}
    for path, node in _walk_schema(load_values_schema()):
        if node.get("type") == "object" and path not in free_form:
            assert "additionalProperties" in node, path
            assert node["additionalProperties"] is False or "properties" not in node, path


# Kubernetes types passed through as they are; their keys are optional by design.
KUBERNETES_TYPES = {"resources", "affinity", "tolerations", "nodeSelector", "imagePullSecrets"}


def _compare(schema: dict[str, Any], values: Any, path: str) -> None:
    if not isinstance(values, dict) or "properties" not in schema or not values:
        return
    assert set(schema["properties"]) == set(values), path or "/"
    for key, value in values.items():
        if key not in KUBERNETES_TYPES:
            _compare(schema["properties"][key], value, f"{path}/{key}")


def test_schema_and_values_yaml_have_the_same_keys() -> None:
    _compare(load_values_schema(), load_values_yaml(), "")


def _leaf_paths(values: Any, path: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [p for key, child in values.items() for p in _leaf_paths(child, f"{path}.{key}")]
    return [path]


def test_every_value_is_used_by_a_template() -> None:
    sources = "\n".join(t["data"] for t in chart().templates)
    for leaf in _leaf_paths(load_values_yaml()):
        parts = leaf.lstrip(".").split(".")
        prefixes = [".Values." + ".".join(parts[:n]) for n in range(len(parts), 0, -1)]
        used = any(re.search(re.escape(p) + r"(?![\w.])", sources) for p in prefixes)
        assert used, f"{leaf.lstrip('.')} is not used by any template"


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w-]*):")


def test_every_value_is_documented() -> None:
    """Each key has a comment right above it, or sits inside a documented block."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    documented_at: list[int] = []  # indents of the enclosing documented keys
    for number, line in enumerate(lines):
        match = _KEY.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        documented_at = [i for i in documented_at if i < indent]
        previous = lines[number - 1].strip() if number else ""
        if previous.startswith("#"):
            documented_at.append(indent)
            continue
        rest = line[match.end() :].strip()
        is_block = rest == "" and number + 1 < len(lines)
        assert is_block or documented_at, f"values.yaml:{number + 1}: {match['key']} has no comment"


def test_schema_validates_before_any_template_runs() -> None:
    # A typo fails on the schema, not later with a template error.
    with pytest.raises(helm.HelmValuesError):
        render({"metric": {"port": 9090}})
