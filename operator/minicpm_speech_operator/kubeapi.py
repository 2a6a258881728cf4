"""Every Kubernetes API call the reconciler makes goes through this one small client.

Objects travel as plain dicts (raw JSON, no model round-trip that could drop fields).
Absence is ``None``, not an exception; a conflict on create is reported as such so
the caller can converge instead of failing. The blocking client runs on a thread.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kubernetes.client as k8s
from kubernetes.client.exceptions import ApiException

from .manifests import GROUP

MERGE_PATCH = "application/merge-patch+json"


class AlreadyExists(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Verbs:
    read: Callable[..., Any]
    create: Callable[..., Any]
    patch: Callable[..., Any]
    list: Callable[..., Any]
    delete: Callable[..., Any]


class KubeApi:
    def __init__(self, configuration: k8s.Configuration) -> None:
        client = k8s.ApiClient(configuration)
        core, apps = k8s.CoreV1Api(client), k8s.AppsV1Api(client)
        self._custom = k8s.CustomObjectsApi(client)
        self._verbs = {
            "ConfigMap": _verbs(core, "namespaced_config_map"),
            "Secret": _verbs(core, "namespaced_secret"),
            "Service": _verbs(core, "namespaced_service"),
            "Deployment": _verbs(apps, "namespaced_deployment"),
            # The benchmark Jobs, and their pods, read for the termination message only.
            "Job": _verbs(k8s.BatchV1Api(client), "namespaced_job"),
            "Pod": _verbs(core, "namespaced_pod"),
        }

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await _absent_as_none(self._verbs[kind].read, name, namespace)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        verbs = self._verbs[body["kind"]]
        try:
            created: dict[str, Any] = await _call(verbs.create, body["metadata"]["namespace"], body)
            return created
        except ApiException as error:
            if error.status == 409:
                raise AlreadyExists(body["metadata"]["name"]) from error
            raise

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        return await _call(self._verbs[kind].patch, name, namespace, patch,
                           _content_type=MERGE_PATCH)

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        found = await _call(self._verbs[kind].list, namespace, label_selector=label_selector)
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job's pods and ConfigMap follow it);
        False when it was already gone."""
        try:
            await _call(self._verbs[kind].delete, name, namespace,
                        propagation_policy="Background")
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    async def get_speech(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await _absent_as_none(self._custom.get_namespaced_custom_object,
                                     GROUP, "v1alpha1", namespace, "minicpmspeeches", name)

    async def create_speech(self, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"].get("namespace", "default")
        created: dict[str, Any] = await _call(self._custom.create_namespaced_custom_object,
                                              GROUP, "v1alpha1", namespace, "minicpmspeeches", body)
        return created

    async def patch_speech(self, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        return await _call(self._custom.patch_namespaced_custom_object,
                           GROUP, "v1alpha1", namespace, "minicpmspeeches", name, patch,
                           _content_type=MERGE_PATCH)

    async def patch_speech_status(self, namespace: str, name: str, status: dict[str, Any]) -> Any:
        return await _call(self._custom.patch_namespaced_custom_object_status,
                           GROUP, "v1alpha1", namespace, "minicpmspeeches", name,
                           {"status": status}, _content_type=MERGE_PATCH)


def _verbs(api: Any, suffix: str) -> _Verbs:
    return _Verbs(
        read=getattr(api, f"read_{suffix}"),
        create=getattr(api, f"create_{suffix}"),
        patch=getattr(api, f"patch_{suffix}"),
        list=getattr(api, f"list_{suffix}"),
        delete=getattr(api, f"delete_{suffix}"),
    )


async def _call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    response = await asyncio.to_thread(method, *args, _preload_content=False, **kwargs)
    return json.loads(response.data)


async def _absent_as_none(method: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = await _call(method, *args)
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return found

