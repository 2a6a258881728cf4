"""Shared inputs for the operator's unit tests: manifests as a user writes them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "minicpmspeech.yaml"
REVISION = "44151b35f1b232a280bda5a87ea1a7575d5433fb"


def example_manifest() -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return manifest


def speech_body(spec: dict[str, Any] | None = None, *, name: str = "speech",
                namespace: str = "voices", uid: str = "uid-1") -> dict[str, Any]:
    """A resource as the API server would hand it to the operator."""
    return {
        "apiVersion": "serving.minicpm-speech.io/v1alpha1",
        "kind": "MiniCPMSpeech",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "generation": 1},
        "spec": copy.deepcopy(spec if spec is not None else example_manifest()["spec"]),
    }


def claim_spec(**runtime: Any) -> dict[str, Any]:
    return {
        "model": {"pvc": {"claimName": "weights", "path": "MiniCPM-o-4_5"}},
        "runtime": runtime,
    }
