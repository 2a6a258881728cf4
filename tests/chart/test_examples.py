"""Every example manifest is one the API server accepts, and every bundled profile has one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from minicpm_speech_operator.crd_schema import (
    manifest_errors,
    strict_json_schema,
    version_schema,
    with_defaults,
)

from tests.chart.rendering import EXAMPLES_DIR, KUBE_VERSION, REPO_ROOT, load_crd
from tests.harness.cel import rule_failures

EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))
API_VERSION = "serving.minicpm-speech.io/v1alpha1"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def speeches(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in documents(path) if doc["kind"] == "MiniCPMSpeech"]


def validation_errors(manifest: dict[str, Any]) -> list[str]:
    """The schema's verdict, then the CEL rules' (evaluated on the defaulted object)."""
    schema = version_schema()
    return [*(str(error) for error in manifest_errors(manifest)),
            *(f"{failure.path}: {failure.message}"
              for failure in rule_failures(schema, with_defaults(schema, manifest)))]


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "minicpmspeech.yaml",
        "high-concurrency.yaml",
        "low-latency.yaml",
        "pvc-model.yaml",
    }


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_crd_schema(path: Path) -> None:
    assert speeches(path), f"{path.name} holds no MiniCPMSpeech"
    for manifest in speeches(path):
        assert manifest["apiVersion"] == API_VERSION
        assert validation_errors(manifest) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_commented_and_namespace_free(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("#"), "start with a comment saying what the example shows"
    assert f"kubectl apply -f examples/{path.name}" in text
    for doc in documents(path):
        # No namespace: `kubectl -n NS apply -f` must put it where the operator watches.
        assert "namespace" not in doc["metadata"]
        if doc["kind"] != "MiniCPMSpeech":
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_examples_have_distinct_names() -> None:
    names = [m["metadata"]["name"] for path in EXAMPLES for m in speeches(path)]
    assert len(names) == len(set(names))


def bundled_profiles() -> set[str]:
    return {p.stem for p in (REPO_ROOT / "profiles").glob("*.y*ml")}


def example_profiles() -> set[str]:
    return {
        m["spec"].get("profile", {}).get("name", "default")
        for path in EXAMPLES
        for m in speeches(path)
    }


def test_every_bundled_profile_has_an_example() -> None:
    assert bundled_profiles() <= example_profiles()


def test_examples_only_name_bundled_profiles() -> None:
    if not bundled_profiles():
        pytest.skip("profiles/ holds no profile yet")
    assert example_profiles() <= bundled_profiles()


# The checker must refuse what the API server refuses, or the tests above prove nothing.
BASE = speeches(EXAMPLES_DIR / "minicpmspeech.yaml")[0]
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "both model sources": (
        {
            "model": {
                "huggingFace": BASE["spec"]["model"]["huggingFace"],
                "pvc": {"claimName": "weights"},
            }
        },
        "spec.model",
    ),
    "no model source": ({"model": {"servedModelName": "x"}}, "spec.model"),
    "short revision": (
        {"model": {"huggingFace": {"repo": "a/b", "revision": "main"}}},
        "spec.model.huggingFace.revision",
    ),
    "both profile sources": (
        {"profile": {"name": "default", "configMapRef": {"name": "p"}}},
        "spec.profile",
    ),
    "replicas over the maximum": ({"replicas": 65}, "spec.replicas"),
    "negative replicas": ({"replicas": -1}, "spec.replicas"),
    "bad pull policy": (
        {"runtime": {"imagePullPolicy": "Sometimes"}},
        "spec.runtime.imagePullPolicy",
    ),
    "unknown field": ({"runtime": {"mps": {"enable": True}}}, "spec.runtime.mps.enable"),
    "concurrency off the grid": ({"perf": {"concurrencies": [3]}}, "spec.perf.concurrencies[0]"),
    "wrong type": ({"replicas": "2"}, "spec.replicas"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_the_checker_refuses_what_the_api_server_refuses(case: str) -> None:
    spec_change, where = REFUSED[case]
    manifest = copy.deepcopy(BASE)
    manifest["spec"].update(spec_change)
    errors = validation_errors(manifest)
    assert any(error.startswith(f"{where}:") for error in errors), errors


def test_preserve_unknown_fields_subtrees_accept_anything() -> None:
    manifest = copy.deepcopy(BASE)
    manifest["spec"]["profileOverrides"] = {"stages": [{"stage_id": 2, "anything": True}]}
    assert validation_errors(manifest) == []


def test_defaults_are_applied_before_validation() -> None:
    defaulted = with_defaults(version_schema(), BASE)
    assert defaulted["spec"]["replicas"] == 1
    assert defaulted["spec"]["runtime"]["mps"]["activeThreadPercentage"] == 100
    assert defaulted["spec"]["perf"]["headlineConcurrency"] == 8


def _schemas_with_defaults(schema: dict[str, Any], path: str = "") -> list[tuple[str, Any]]:
    found = [(path, schema)] if "default" in schema else []
    for name, child in schema.get("properties", {}).items():
        found += _schemas_with_defaults(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += _schemas_with_defaults(schema["items"], f"{path}[]")
    return found


def test_every_crd_default_is_valid_for_its_own_field() -> None:
    # The API server refuses a CRD whose defaults do not validate.
    for path, schema in _schemas_with_defaults(version_schema()):
        defaulted = with_defaults(schema, schema["default"])
        validator = jsonschema.Draft4Validator(strict_json_schema(schema))
        errors = list(validator.iter_errors(defaulted))
        assert errors == [], path


def test_crd_names_match_the_examples() -> None:
    spec = load_crd()["spec"]
    assert f"{spec['group']}/{spec['versions'][0]['name']}" == API_VERSION
    assert spec["names"]["kind"] == "MiniCPMSpeech"
    assert "mcs" in spec["names"]["shortNames"]


def test_the_operator_judges_the_examples_the_same() -> None:
    from minicpm_speech_operator import crd_schema
    from minicpm_speech_operator.errors import InvalidSpec

    for path in EXAMPLES:
        for manifest in speeches(path):
            crd_schema.validate_spec(manifest["spec"])
    for spec_change, _ in REFUSED.values():
        spec = {**copy.deepcopy(BASE["spec"]), **spec_change}
        defaulted = crd_schema.with_defaults(crd_schema.spec_schema(), spec)
        with pytest.raises(InvalidSpec):
            crd_schema.validate_spec(defaulted)
