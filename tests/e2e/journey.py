"""Steps of a user's journey, shared by the behaviour tests and the RBAC proof."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.harness.cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
NAME = "speech"
HASH_LABEL = "serving.minicpm-speech.io/config-hash"


def example_spec(file: str = "minicpmspeech.yaml") -> dict[str, Any]:
    # An example may hold the Secrets it refers to before the resource itself.
    documents = yaml.safe_load_all((EXAMPLES / file).read_text())
    spec: dict[str, Any] = next(d for d in documents if d and d["kind"] == "MiniCPMSpeech")["spec"]
    return spec


def condition(speech: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    conditions = ((speech or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def settled(cluster: Cluster, name: str = NAME) -> Any:
    """The resource once the operator has observed its current generation."""

    def observed() -> dict[str, Any] | None:
        speech = cluster.api.get_speech(name)
        status = (speech or {}).get("status") or {}
        generation = (speech or {}).get("metadata", {}).get("generation")
        return speech if speech and status.get("observedGeneration") == generation else None

    return observed


async def create_and_settle(cluster: Cluster, spec: dict[str, Any] | None = None,
                            name: str = NAME) -> dict[str, Any]:
    cluster.api.create_speech(name, copy.deepcopy(spec or example_spec()))
    speech: dict[str, Any] = await cluster.wait_for(settled(cluster, name))
    await cluster.wait_for(lambda: cluster.api.get("service", name), message="service exists")
    return speech


async def mark_rolled_out(cluster: Cluster, name: str = NAME) -> None:
    """What the Deployment controller and a warmed-up pod would report."""
    deployment = cluster.api.get("deployment", name)
    assert deployment is not None
    replicas = deployment["spec"]["replicas"]
    cluster.api.patch("deployment", name, {"status": {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas, "updatedReplicas": replicas,
        "readyReplicas": replicas, "availableReplicas": replicas}}, status=True)


def children(cluster: Cluster, name: str = NAME) -> dict[str, dict[str, Any] | None]:
    return {
        "configmap": cluster.api.get("configmap", f"{name}-deploy-config"),
        "deployment": cluster.api.get("deployment", name),
        "service": cluster.api.get("service", name),
    }


def versions(cluster: Cluster, name: str = NAME) -> dict[str, str]:
    return {kind: (obj or {}).get("metadata", {}).get("resourceVersion", "")
            for kind, obj in children(cluster, name).items()}


def events(cluster: Cluster, name: str = NAME) -> list[dict[str, Any]]:
    return [e for e in cluster.api.list_objects("event")
            if (e.get("involvedObject") or {}).get("name") == name
            and (e.get("involvedObject") or {}).get("kind") == "MiniCPMSpeech"]


def event_reasons(cluster: Cluster, name: str = NAME) -> set[str]:
    return {e.get("reason", "") for e in events(cluster, name)}
