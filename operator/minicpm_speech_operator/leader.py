"""Lease-based leader election, so two operator replicas never reconcile at once.

The standby waits for the Lease to expire; the leader renews it well inside its
duration and exits the process the moment a renewal fails, so a partitioned leader
never keeps writing next to a new one (Kubernetes restarts it as a standby).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

import kubernetes.client as k8s
from kubernetes.client.exceptions import ApiException

from .kubeapi import MERGE_PATCH

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    duration_seconds: int = 15
    renew_every_seconds: float = 5.0
    retry_every_seconds: float = 2.0


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _format(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_expired(lease: dict[str, Any], now: datetime.datetime) -> bool:
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime")
    if not renewed:
        return True
    renewed_at = datetime.datetime.fromisoformat(renewed.replace("Z", "+00:00"))
    duration = float(spec.get("leaseDurationSeconds", 15))
    return (now - renewed_at).total_seconds() > duration


class LeaderElector:
    def __init__(self, configuration: k8s.Configuration, config: LeaseConfig) -> None:
        self._api = k8s.CoordinationV1Api(k8s.ApiClient(configuration))
        self._config = config

    def _spec(self, acquired: bool) -> dict[str, Any]:
        now = _format(_now())
        spec = {"holderIdentity": self._config.identity, "renewTime": now,
                "leaseDurationSeconds": self._config.duration_seconds}
        return spec | ({"acquireTime": now} if acquired else {})

    def try_acquire_or_renew(self) -> bool:
        cfg = self._config
        try:
            lease = self._api.read_namespaced_lease(cfg.name, cfg.namespace,
                                                    _preload_content=False)
        except ApiException as error:
            if error.status != 404:
                raise
            body = {"metadata": {"name": cfg.name, "namespace": cfg.namespace},
                    "spec": self._spec(acquired=True)}
            try:
                self._api.create_namespaced_lease(cfg.namespace, body)  # type: ignore[arg-type]
            except ApiException as race:
                if race.status == 409:
                    return False
                raise
            return True
        current = json.loads(lease.data)  # type: ignore[attr-defined]
        holder = (current.get("spec") or {}).get("holderIdentity")
        if holder != cfg.identity and not is_expired(current, _now()):
            return False
        # resourceVersion makes the takeover conditional: two standbys cannot both win.
        patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                 "spec": self._spec(acquired=holder != cfg.identity)}
        try:
            self._api.patch_namespaced_lease(cfg.name, cfg.namespace, patch,
                                             _content_type=MERGE_PATCH)
        except ApiException as conflict:
            if conflict.status == 409:
                return False
            raise
        return True

    async def acquire(self) -> None:
        while not await asyncio.to_thread(self.try_acquire_or_renew):
            await asyncio.sleep(self._config.retry_every_seconds)
        log.info("Leading as %s (Lease %s/%s)", self._config.identity,
                 self._config.namespace, self._config.name)

    def release(self) -> None:
        """Hand the Lease over at once on a clean stop, instead of making the next wait."""
        cfg = self._config
        try:
            lease = json.loads(self._api.read_namespaced_lease(  # type: ignore[attr-defined]
                cfg.name, cfg.namespace, _preload_content=False).data)
            if (lease.get("spec") or {}).get("holderIdentity") != cfg.identity:
                return
            patch = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                     "spec": {"holderIdentity": None, "renewTime": None,
                              "leaseDurationSeconds": 1}}
            self._api.patch_namespaced_lease(cfg.name, cfg.namespace, patch,
                                             _content_type=MERGE_PATCH)
        except ApiException:
            log.warning("Could not release the Lease; a standby takes over when it expires")

    async def keep_renewing(self) -> None:
        while True:
            await asyncio.sleep(self._config.renew_every_seconds)
            try:
                renewed = await asyncio.to_thread(self.try_acquire_or_renew)
            except Exception:
                log.exception("Lease renewal failed")
                renewed = False
            if not renewed:
                log.error("Lost the Lease; exiting so a standby takes over")
                os._exit(1)
