"""The last configuration that passed the gate, kept in a ConfigMap the resource owns.

It holds what a rollback needs (the rendered deploy config and the spec that produced it,
so image, model and MPS come back too, even after a referenced profile ConfigMap changed)
and what the next gate compares with (its numbers and the verdicts it passed with).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidSpec
from ..manifests import CONFIG_HASH_KEY, DEPLOY_CONFIG_FILE, Owner, owner_reference, selector_labels
from ..names import LASTGOOD_SUFFIX
from ..serving_config import ServingConfig
from ..spec import SpeechSpec, parse_spec

SPEC_FILE = "spec.json"
RESULTS_FILE = "results.json"


@dataclass(frozen=True, slots=True)
class LastGood:
    config_hash: str
    profile: str
    deploy_config: str
    spec: Mapping[str, Any]  # the defaulted spec that rendered deploy_config
    results: Mapping[str, Any]  # points, wer, baseline, perfGate, qualityGate, recordedAt

    @property
    def recorded_at(self) -> str:
        return str(self.results.get("recordedAt", ""))


def lastgood_name(owner: Owner) -> str:
    return f"{owner.name}{LASTGOOD_SUFFIX}"


def build_lastgood_configmap(owner: Owner, record: LastGood) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": lastgood_name(owner),
            "namespace": owner.namespace,
            "labels": {
                **selector_labels(owner),
                "app.kubernetes.io/component": "last-good-config",
                "app.kubernetes.io/managed-by": "minicpm-speech-operator",
                CONFIG_HASH_KEY: record.config_hash,
            },
            "ownerReferences": [owner_reference(owner)],
        },
        "data": {
            "config-hash": record.config_hash,
            "profile": record.profile,
            DEPLOY_CONFIG_FILE: record.deploy_config,
            SPEC_FILE: json.dumps(record.spec, sort_keys=True, indent=1),
            RESULTS_FILE: json.dumps(record.results, sort_keys=True, indent=1),
        },
    }


def lastgood_from_configmap(configmap: Mapping[str, Any] | None) -> LastGood | None:
    """The record, or None when there is none or it cannot be read (then none is assumed)."""
    data = (configmap or {}).get("data") or {}
    try:
        return LastGood(
            config_hash=data["config-hash"],
            profile=data.get("profile", ""),
            deploy_config=data[DEPLOY_CONFIG_FILE],
            spec=json.loads(data[SPEC_FILE]),
            results=json.loads(data[RESULTS_FILE]),
        )
    except (KeyError, ValueError):
        return None


def serving_of(record: LastGood, today: SpeechSpec) -> tuple[SpeechSpec, ServingConfig] | None:
    """The spec and config to serve on rollback, scaled as today's spec says (its replicas or
    its autoscaling, and its benchmark placement, which must agree with the autoscaling); None
    when the recorded spec is no longer valid (a newer CRD refuses it): then there is nothing
    to roll back to."""
    scaling = {key: today.raw[key] for key in ("replicas", "autoscaling", "perf")}
    try:
        spec = parse_spec({**record.spec, **scaling})
    except InvalidSpec:
        return None
    return spec, ServingConfig(record.profile, record.deploy_config, record.config_hash)
