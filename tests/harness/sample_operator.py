"""A throwaway operator for the harness's own end-to-end test: one owned ConfigMap per object."""

from __future__ import annotations

from typing import Any

import kopf
import kubernetes.client
from minicpm_speech_operator.kubeconfig import api_client, connection_from_environment

SPEECHES = ("serving.minicpm-speech.io", "v1alpha1", "minicpmspeeches")

kopf.on.login()(connection_from_environment)


@kopf.on.create(*SPEECHES)
def create_config(body: kopf.Body, name: str, namespace: str | None, **_: Any) -> dict[str, str]:
    assert namespace is not None  # the resource is namespaced
    config_map: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"{name}-config"},
        "data": {"model": str(body.spec.get("model", ""))},
    }
    kopf.adopt(config_map, owner=body)
    with api_client() as client:
        kubernetes.client.CoreV1Api(client).create_namespaced_config_map(namespace, config_map)  # type: ignore[arg-type]
    kopf.info(body, reason="Configured", message=f"ConfigMap {name}-config created")
    return {"configMap": config_map["metadata"]["name"]}


@kopf.on.delete(*SPEECHES)
def release(**_: Any) -> None:
    """Nothing to do: it makes Kopf put a finalizer on the object, as real operators do."""
