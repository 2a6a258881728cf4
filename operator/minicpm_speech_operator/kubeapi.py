"""Every Kubernetes API call the reconciler makes goes through this one small client.

Objects travel as plain dicts (raw JSON, no model round-trip that could drop fields).
Absence is ``None``, not an exception; a conflict on create is reported as such so
the caller can converge instead of failing.

The blocking official client runs on a pool of its own (:data:`API_THREADS`), not on the
event loop's default executor: the Lease is renewed on another thread (:mod:`.leader`), so a
hung API server holding every reconcile call cannot delay a renewal. Every call has a connect
and a read timeout. Kept over an asyncio client (kubernetes-asyncio) because the official
client's typed methods and ``_preload_content=False`` raw JSON are what the reconciler and
the tests share, and a sized pool with timeouts bounds it as well. Every write first asks
whether this replica may write (``may_write``: a leader whose lease is not known to be fresh
raises :class:`~.retries.NotLeading`, which Kopf retries).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kubernetes.client as k8s
from kubernetes.client.exceptions import ApiException

from .errors import InvalidSpec
from .manifests import GROUP
from .retries import NotLeading

MERGE_PATCH = "application/merge-patch+json"
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
API_THREADS = 16


class AlreadyExists(Exception):
    pass


class RefusedByServer(InvalidSpec):
    """A child the API server would not store (422 Invalid, 413 too large): the spec cannot
    be served, and retrying will not change that. The server's own reason, capped, is kept."""


REFUSALS = (413, 422)


def refused(kind: str, name: str, error: ApiException) -> RefusedByServer:
    try:
        message = str(json.loads(error.body or "{}").get("message") or error.reason)
    except (ValueError, AttributeError):
        message = str(error.body or error.reason)
    return RefusedByServer(f"{kind} {name}", f"refused by the API server ({error.status}): "
                           f"{message}", "Change the field of the spec that sets what the "
                           "server names")


@dataclass(frozen=True, slots=True)
class _Verbs:
    read: Callable[..., Any]
    create: Callable[..., Any]
    patch: Callable[..., Any]
    list: Callable[..., Any]
    delete: Callable[..., Any]


class KubeApi:
    def __init__(self, configuration: k8s.Configuration,
                 may_write: Callable[[], bool] | None = None) -> None:
        from . import leader  # it imports this module's MERGE_PATCH

        self._pool = ThreadPoolExecutor(API_THREADS, thread_name_prefix="kube-api")
        self._may_write = may_write or leader.may_write
        client = k8s.ApiClient(configuration)
        core, apps = k8s.CoreV1Api(client), k8s.AppsV1Api(client)
        self._custom = k8s.CustomObjectsApi(client)
        self._verbs = {
            "ConfigMap": _verbs(core, "namespaced_config_map"),
            "Secret": _verbs(core, "namespaced_secret"),
            "Service": _verbs(core, "namespaced_service"),
            "Deployment": _verbs(apps, "namespaced_deployment"),
            "HorizontalPodAutoscaler": _verbs(k8s.AutoscalingV2Api(client),
                                              "namespaced_horizontal_pod_autoscaler"),
            # The benchmark Jobs, and their pods, read for the termination message only.
            "Job": _verbs(k8s.BatchV1Api(client), "namespaced_job"),
            "Pod": _verbs(core, "namespaced_pod"),
        }

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._absent_as_none(self._verbs[kind].read, name, namespace)

    async def create(self, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """``dry_run``: the server validates and admits the object but stores nothing."""
        verbs = self._verbs[body["kind"]]
        try:
            created: dict[str, Any] = await self._call(
                verbs.create, body["metadata"]["namespace"], body, **_dry(dry_run))
            return created
        except ApiException as error:
            if error.status == 409:
                raise AlreadyExists(body["metadata"]["name"]) from error
            if error.status in REFUSALS:
                raise refused(body["kind"], body["metadata"]["name"], error) from error
            raise

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any],
                    dry_run: bool = False) -> Any:
        try:
            return await self._call(self._verbs[kind].patch, name, namespace, patch,
                                    _content_type=MERGE_PATCH, **_dry(dry_run))
        except ApiException as error:
            if error.status in REFUSALS:
                raise refused(kind, name, error) from error
            raise

    async def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        found = await self._call(self._verbs[kind].list, namespace, label_selector=label_selector)
        items: list[dict[str, Any]] = found.get("items") or []
        return items

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete with background propagation (a Job's pods and ConfigMap follow it);
        False when it was already gone."""
        try:
            await self._call(self._verbs[kind].delete, name, namespace,
                             propagation_policy="Background")
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    async def get_speech(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._absent_as_none(self._custom.get_namespaced_custom_object,
                                          GROUP, "v1alpha1", namespace, "minicpmspeeches", name)

    async def create_speech(self, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"].get("namespace", "default")
        created: dict[str, Any] = await self._call(
            self._custom.create_namespaced_custom_object,
            GROUP, "v1alpha1", namespace, "minicpmspeeches", body)
        return created

    async def patch_speech(self, namespace: str, name: str, patch: dict[str, Any]) -> Any:
        return await self._call(self._custom.patch_namespaced_custom_object,
                                GROUP, "v1alpha1", namespace, "minicpmspeeches", name, patch,
                                _content_type=MERGE_PATCH)

    async def patch_speech_status(self, namespace: str, name: str, status: dict[str, Any]) -> Any:
        return await self._call(self._custom.patch_namespaced_custom_object_status,
                                GROUP, "v1alpha1", namespace, "minicpmspeeches", name,
                                {"status": status}, _content_type=MERGE_PATCH)

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not method.__name__.startswith(("read_", "list_", "get_")) and not self._may_write():
            raise NotLeading(f"{method.__name__}: this replica's lease is not fresh")
        call = functools.partial(method, *args, _preload_content=False,
                                 _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S), **kwargs)
        response = await asyncio.get_running_loop().run_in_executor(self._pool, call)
        return json.loads(response.data)

    async def _absent_as_none(self, method: Callable[..., Any], *args: Any
                              ) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self._call(method, *args)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found


def _dry(dry_run: bool) -> dict[str, str]:
    return {"dry_run": "All"} if dry_run else {}


def _verbs(api: Any, suffix: str) -> _Verbs:
    return _Verbs(
        read=getattr(api, f"read_{suffix}"),
        create=getattr(api, f"create_{suffix}"),
        patch=getattr(api, f"patch_{suffix}"),
        list=getattr(api, f"list_{suffix}"),
        delete=getattr(api, f"delete_{suffix}"),
    )
