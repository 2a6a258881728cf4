"""Small blocking helpers over the official client, bound to one namespace.

Objects come back as the plain JSON the server sent (camelCase keys, nothing dropped by a
model round-trip); an absent object is ``None``. Kinds are named in the singular:
``minicpmspeech``, ``configmap``, ``secret``, ``service``, ``deployment``,
``horizontalpodautoscaler``, ``event``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.config
from kubernetes.client.exceptions import ApiException

from .crds import CustomResource

Body = dict[str, Any]

# The harness's own requests carry this User-Agent, so that the request log can leave them out.
USER_AGENT = "minicpm-speech-test-harness"

SPEECH = "minicpmspeech"
_BUILTINS = {  # kind -> (API class attribute, method suffix of the official client)
    "configmap": ("core", "namespaced_config_map"),
    "secret": ("core", "namespaced_secret"),
    "service": ("core", "namespaced_service"),
    "deployment": ("apps", "namespaced_deployment"),
    "horizontalpodautoscaler": ("autoscaling", "namespaced_horizontal_pod_autoscaler"),
    "event": ("core", "namespaced_event"),
}
_MERGE_PATCH = "application/merge-patch+json"
_JSON_PATCH = "application/json-patch+json"


def _json(response: Any) -> Any:
    return json.loads(response.data) if response.data else None


class KubeApi:
    def __init__(self, kubeconfig_path: Path | str, namespace: str, speech: CustomResource) -> None:
        self.client = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kubeconfig_path), persist_config=False
        )
        self.client.user_agent = USER_AGENT
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.apps = kubernetes.client.AppsV1Api(self.client)
        self.autoscaling = kubernetes.client.AutoscalingV2Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        self.namespace = namespace
        self.speech = speech

    def close(self) -> None:
        self.client.close()

    # --- MiniCPMSpeech ------------------------------------------------------------------

    def create_speech(self, name: str, spec: Body, *, labels: dict[str, str] | None = None) -> Body:
        metadata: Body = {"name": name, **({"labels": labels} if labels else {})}
        body = {"apiVersion": self.speech.api_version, "kind": self.speech.kind}
        return self.create(SPEECH, {**body, "metadata": metadata, "spec": spec})

    def get_speech(self, name: str) -> Body | None:
        return self.get(SPEECH, name)

    def patch_speech(self, name: str, patch: Body | list[Body]) -> Body:
        return self.patch(SPEECH, name, patch)

    def patch_speech_status(self, name: str, status: Body) -> Body:
        return self.patch(SPEECH, name, {"status": status}, status=True)

    def delete_speech(self, name: str) -> bool:
        return self.delete(SPEECH, name)

    # --- any kind -----------------------------------------------------------------------

    def get(self, kind: str, name: str) -> Body | None:
        try:
            if kind == SPEECH:
                response = self.custom.get_namespaced_custom_object(
                    *self._custom_args(), name, _preload_content=False
                )
            else:
                response = self._method(kind, "read")(name, self.namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        result: Body = _json(response)
        return result

    def list_objects(self, kind: str, *, label_selector: str | None = None) -> list[Body]:
        options: Body = {"label_selector": label_selector} if label_selector else {}
        if kind == SPEECH:
            response = self.custom.list_namespaced_custom_object(
                *self._custom_args(), _preload_content=False, **options
            )
        else:
            response = self._method(kind, "list")(self.namespace, _preload_content=False, **options)
        items: list[Body] = _json(response)["items"]
        return items

    def create(self, kind: str, body: Body) -> Body:
        if kind == SPEECH:
            response = self.custom.create_namespaced_custom_object(
                *self._custom_args(), body, _preload_content=False
            )
        else:
            response = self._method(kind, "create")(self.namespace, body, _preload_content=False)
        result: Body = _json(response)
        return result

    def patch(
        self, kind: str, name: str, patch: Body | list[Body], *, status: bool = False
    ) -> Body:
        """A JSON merge patch (a dict) or a JSON patch (a list); ``status=True`` for /status."""
        options: Body = {
            "_content_type": _JSON_PATCH if isinstance(patch, list) else _MERGE_PATCH,
            "_preload_content": False,
        }
        suffix = "_status" if status else ""
        if kind == SPEECH:
            method = getattr(self.custom, f"patch_namespaced_custom_object{suffix}")
            response = method(*self._custom_args(), name, patch, **options)
        else:
            response = self._method(kind, "patch", status)(name, self.namespace, patch, **options)
        result: Body = _json(response)
        return result

    def delete(self, kind: str, name: str) -> bool:
        """Delete; ``False`` if there was nothing to delete."""
        try:
            if kind == SPEECH:
                self.custom.delete_namespaced_custom_object(
                    *self._custom_args(), name, _preload_content=False
                )
            else:
                self._method(kind, "delete")(name, self.namespace, _preload_content=False)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def _custom_args(self) -> tuple[str, str, str, str]:
        return (self.speech.group, self.speech.version, self.namespace, self.speech.plural)

    def _method(self, kind: str, verb: str, status: bool = False) -> Any:
        if kind not in _BUILTINS:
            raise ValueError(
                f"unknown kind {kind!r}; expected {SPEECH!r} or one of {sorted(_BUILTINS)}"
            )
        api, suffix = _BUILTINS[kind]
        # The official client names subresource calls patch_namespaced_deployment_status.
        return getattr(getattr(self, api), f"{verb}_{suffix}{'_status' if status else ''}")
