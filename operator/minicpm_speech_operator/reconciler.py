"""One level-triggered reconcile: read the resource, converge its children, report.

Every trigger (create, update, resume after restart, a child changed or deleted, the
periodic resync) runs the same function, so a retry never repeats a finished step and
a restart mid-way converges without duplicates.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import metrics
from .apply import apply, is_controlled_by
from .errors import InvalidSpec
from .kubeapi import KubeApi
from .manifests import Owner, build_children, configmap_name, endpoint_url, owner_of
from .serving_config import ServingConfig, check_token_secret, profile_document, serving_config
from .spec import SpeechSpec, parse_spec
from .status import Served, build_status, served_from

EventSink = Callable[[Mapping[str, Any], str, str, str], None]
Result = Literal["ok", "invalid", "gone"]


@dataclass(slots=True)
class Outcome:
    result: Result
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # (kind, name, action)
    status: dict[str, Any] = field(default_factory=dict)


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    def __init__(self, api: KubeApi, emit: EventSink, clock: Callable[[], str] = utc_now):
        self._api, self._emit, self._clock = api, emit, clock
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def reconcile(self, namespace: str, name: str) -> Outcome:
        # Handlers for the resource and for its children run concurrently in Kopf.
        async with self._locks.setdefault((namespace, name), asyncio.Lock()):
            with metrics.DURATION.time():
                try:
                    outcome = await self._reconcile(namespace, name)
                except Exception:
                    metrics.RECONCILES.labels("error").inc()
                    metrics.FAILURES.labels("ApiError").inc()
                    raise
            metrics.RECONCILES.labels(outcome.result).inc()
            return outcome

    async def _reconcile(self, namespace: str, name: str) -> Outcome:
        body = await self._api.get_speech(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return Outcome("gone")
        owner, previous = owner_of(body), body.get("status") or {}
        try:
            spec = parse_spec(body.get("spec"))
            cfg = await self._serving_config(namespace, spec)
        except InvalidSpec as invalid:
            metrics.FAILURES.labels(invalid.reason).inc()
            return await self._refuse(body, owner, invalid)
        changes: list[tuple[str, str, str]] = []
        deployment = None
        try:
            for child in build_children(owner, spec, cfg):
                live, action = await apply(self._api, child, owner.uid)
                changes.append((child["kind"], child["metadata"]["name"], action))
                if child["kind"] == "Deployment":
                    deployment = live
        except InvalidSpec as conflict:
            metrics.FAILURES.labels(conflict.reason).inc()
            return await self._refuse(body, owner, conflict)
        served = Served(cfg.profile_label, cfg.config_hash, endpoint_url(owner, spec),
                        configmap_name(owner))
        status = build_status(
            generation=body["metadata"].get("generation", 0), served=served,
            deployment=deployment, replicas=spec.replicas, invalid=None,
            previous=previous, now=self._clock(),
        )
        await self._publish(body, status, changes)
        return Outcome("ok", changes, status)

    async def _serving_config(self, namespace: str, spec: SpeechSpec) -> ServingConfig:
        configmap = secret = None
        if spec.profile.configmap_name:
            configmap = await self._api.get("ConfigMap", namespace, spec.profile.configmap_name)
        if spec.model.hub_token:
            secret = await self._api.get("Secret", namespace, spec.model.hub_token.name)
        check_token_secret(spec, secret)
        return serving_config(spec, profile_document(spec, configmap))

    async def _refuse(self, body: dict[str, Any], owner: Owner, invalid: InvalidSpec) -> Outcome:
        """Report the refusal; whatever already serves is left exactly as it is."""
        previous = body.get("status") or {}
        deployment = await self._api.get("Deployment", owner.namespace, owner.name)
        if deployment is not None and not is_controlled_by(deployment, owner.uid):
            deployment = None
        replicas = (deployment or {}).get("spec", {}).get("replicas", 0)
        status = build_status(
            generation=body["metadata"].get("generation", 0), served=served_from(previous),
            deployment=deployment, replicas=replicas, invalid=invalid,
            previous=previous, now=self._clock(),
        )
        await self._publish(body, status, [])
        return Outcome("invalid", [], status)

    async def _publish(
        self, body: dict[str, Any], status: dict[str, Any], changes: list[tuple[str, str, str]]
    ) -> None:
        previous = body.get("status") or {}
        for kind, name, action in changes:
            if action != "unchanged":
                metrics.CHILD_CHANGES.labels(kind, action).inc()
                self._emit(body, "Normal", action.capitalize(), f"{kind} {name} {action}")
        for event in transition_events(previous, status):
            self._emit(body, *event)
        if status != {key: previous.get(key) for key in status}:
            meta = body["metadata"]
            await self._api.patch_speech_status(meta["namespace"], meta["name"], status)


def transition_events(
    previous: Mapping[str, Any], status: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """(type, reason, message) for each change a user would want in `kubectl describe`."""
    events = []
    old_hash, new_hash = previous.get("configHash"), status.get("configHash")
    if new_hash and old_hash != new_hash:
        events.append(("Normal", "ConfigChanged",
                       f"Serving config {old_hash or 'none'} -> {new_hash} ({status['profile']})"))
    old_degraded = _condition(previous, "Degraded")
    new_degraded = _condition(status, "Degraded")
    if new_degraded.get("status") == "True" and (
        old_degraded.get("message") != new_degraded.get("message")
    ):
        events.append(("Warning", new_degraded["reason"], new_degraded["message"]))
    if previous.get("phase") != status.get("phase"):
        kind = "Warning" if status["phase"] == "Degraded" else "Normal"
        ready = _condition(status, "Ready")
        events.append((kind, f"Phase{status['phase']}", ready.get("message", "")))
    return events


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})
