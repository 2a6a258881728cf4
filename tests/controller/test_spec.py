"""A manifest is defaulted and judged exactly as the CRD schema says."""

from __future__ import annotations

from typing import Any

import pytest
from minicpm_speech_operator.errors import InvalidSpec
from minicpm_speech_operator.spec import parse_spec

from .builders import REVISION, claim_spec, example_manifest


def test_example_gets_the_schema_defaults() -> None:
    spec = parse_spec(example_manifest()["spec"])
    assert spec.replicas == 1
    assert spec.profile.name == "default"
    assert spec.runtime.port == 8091 and spec.runtime.health_port == 9400
    assert spec.runtime.mps_enabled and spec.runtime.mps_active_thread_percentage == 100
    assert spec.runtime.graph_precapture
    assert spec.model.hub_revision == REVISION
    assert spec.model.served_model_name == "openbmb/MiniCPM-o-4_5"
    assert spec.perf.enabled is False
    assert spec.perf.gate.concurrencies == (8,)  # the headline concurrency, when not chosen


def test_claim_source_defaults_served_name_to_its_path() -> None:
    spec = parse_spec(claim_spec())
    assert not spec.model.from_hub
    assert spec.model.served_model_name == "MiniCPM-o-4_5"


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({}, "spec.model", "is required"),
        ({"model": {}}, "spec.model", "exactly one of huggingFace, pvc"),
        ({"model": {"huggingFace": {"repo": "a/b", "revision": REVISION},
                    "pvc": {"claimName": "w"}}}, "spec.model", "exactly one"),
        ({"model": {"huggingFace": {"repo": "a/b", "revision": "main"}}},
         "spec.model.huggingFace.revision", "wrong format"),
        ({"model": {"huggingFace": {"repo": "a/b"}}}, "spec.model.huggingFace.revision",
         "is required"),
        ({**claim_spec(), "replicas": -1}, "spec.replicas", "out of range"),
        ({**claim_spec(), "replicas": "two"}, "spec.replicas", "type integer"),
        (claim_spec(mps={"activeThreadPercentage": 101}),
         "spec.runtime.mps.activeThreadPercentage", "out of range"),
        (claim_spec(port=80), "spec.runtime.port", "out of range"),
        (claim_spec(imagePullPolicy="Sometimes"), "spec.runtime.imagePullPolicy", "not allowed"),
        (claim_spec(graphPrecaptur=True), "spec.runtime.graphPrecaptur", "unknown field"),
        ({**claim_spec(), "profile": {"name": "default", "configMapRef": {"name": "p"}}},
         "spec.profile", "exactly one of name, configMapRef"),
        ({"model": {"pvc": {"claimName": "w", "path": "../etc"}}}, "spec.model.pvc.path",
         "wrong format"),
        ({**claim_spec(), "perf": {"placement": "cloud"}}, "spec.perf.placement", "not allowed"),
        ({**claim_spec(), "perf": {"enabled": True, "asrModelClaim": "asr"}},
         "spec.perf.datasetClaim", "is required when spec.perf.enabled"),
        ({**claim_spec(), "perf": {"enabled": True, "datasetClaim": "data"}},
         "spec.perf.asrModelClaim", "is required when spec.perf.enabled"),
        ({**claim_spec(), "perf": {"concurrencies": [1, 2], "headlineConcurrency": 8}},
         "spec.perf.headlineConcurrency", "not among"),
        ({**claim_spec(), "perf": {"concurrencies": [1, 8], "gate": {"concurrencies": [8, 32]}}},
         "spec.perf.gate.concurrencies[1]", "not measured"),
        ({**claim_spec(), "perf": {"concurrencies": [8, 8]}}, "spec.perf.concurrencies[1]",
         "listed twice"),
        ({**claim_spec(), "replicas": 0, "perf": {"enabled": True, "placement": "live",
                                                 "datasetClaim": "d", "asrModelClaim": "a"}},
         "spec.perf.placement", "spec.replicas is 0"),
        ({**claim_spec(), "perf": {"gate": {"maxWerPercent": -1}}},
         "spec.perf.gate.maxWerPercent", "out of range"),
        ({**claim_spec(), "perf": {"job": {"maxAttempts": 9}}}, "spec.perf.job.maxAttempts",
         "out of range"),
    ],
)
def test_bad_manifests_name_the_field_and_the_fix(spec: dict[str, Any], field: str,
                                                  words: str) -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec(spec)
    assert caught.value.field == field
    assert words in caught.value.message
    assert caught.value.fix  # every refusal tells the user what to do
