"""The MiniCPMSpeech custom resource as the tests see it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml
from minicpm_speech_emulator import load_crd

GROUP = "serving.minicpm-speech.io"
VERSION = "v1alpha1"
KIND = "MiniCPMSpeech"
PLURAL = "minicpmspeeches"


@dataclasses.dataclass(frozen=True)
class CustomResource:
    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @classmethod
    def from_crd(cls, path: Path) -> CustomResource:
        spec = load_crd(path)["spec"]
        version = next(v["name"] for v in spec["versions"] if v.get("storage", True))
        return cls(spec["group"], version, spec["names"]["plural"], spec["names"]["kind"])


def write_minimal_crd(directory: Path) -> Path:
    """A CRD of the same names as the chart's, with an open schema, for tests of the harness."""
    open_object = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": "minicpmspeech",
                "shortNames": ["mcs"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": open_object, "status": open_object},
                        }
                    },
                }
            ],
        },
    }
    path = directory / "minicpmspeeches.yaml"
    path.write_text(yaml.safe_dump(crd))
    return path
