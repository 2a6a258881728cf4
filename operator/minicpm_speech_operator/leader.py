"""Lease-based leader election, so two operator replicas never reconcile at once.

The semantics are client-go's: the standby tries every retry period and takes the Lease once
it has expired; the leader renews every retry period, and a failed renewal (an API error, a
timeout, a conflict) is retried until the renew deadline, shorter than the lease, has passed
since the last renewal that succeeded. Only then, or when another holder is seen, does it stop
leading: the process exits and Kubernetes restarts it as a standby.

Between renewals every write asks :func:`may_write`: true only while the last successful
renewal, on the monotonic clock, is younger than the renew deadline. A leader that was paused
(stopped, a frozen node) past its lease therefore writes nothing when it resumes; its next
renewal finds the Lease taken and it exits.

The Lease calls run on a thread of their own, never behind the reconciler's API calls.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kubernetes.client as k8s
from kubernetes.client.exceptions import ApiException

from .kubeapi import CONNECT_TIMEOUT_S, MERGE_PATCH

log = logging.getLogger(__name__)


# client-go's defaults
LEASE_DURATION_S = 15.0
RENEW_DEADLINE_S = 10.0
RETRY_PERIOD_S = 2.0


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    duration_seconds: float = LEASE_DURATION_S
    renew_deadline_seconds: float = RENEW_DEADLINE_S
    retry_period_seconds: float = RETRY_PERIOD_S

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_seconds < self.renew_deadline_seconds \
                < self.duration_seconds:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration; got "
                f"{self.retry_period_seconds} < {self.renew_deadline_seconds} < "
                f"{self.duration_seconds}")


class LeaseConflict(Exception):
    """Another writer changed the Lease between our read and our patch: retried."""


# The elector of this process, when it elects: what may_write asks.
_current: LeaderElector | None = None


def may_write() -> bool:
    """Whether this replica may write now: always without leader election. A leader whose
    last renewal is past the renew deadline (it was paused, or could not reach the API) stops
    leading here, before the write, rather than at its next renewal."""
    elector = _current
    if elector is None or elector.is_fresh():
        return True
    elector.stop_leading(f"no renewal for {elector.config.renew_deadline_seconds:g} s "
                         "at a write")
    return False


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
    def __init__(self, configuration: k8s.Configuration, config: LeaseConfig,
                 clock: Callable[[], float] = time.monotonic,
                 on_lost: Callable[[], object] | None = None) -> None:
        self._api = k8s.CoordinationV1Api(k8s.ApiClient(configuration))
        self._config = config
        self._clock = clock
        # by default the process exits, and Kubernetes restarts it as a standby
        self._on_lost = on_lost or (lambda: os._exit(1))
        self._renewed_at: float | None = None  # monotonic, when the last good renewal began
        self._lane = ThreadPoolExecutor(1, thread_name_prefix="lease")
        # one request must end well inside the renew deadline for a retry to fit
        self._timeout = (CONNECT_TIMEOUT_S, max(1.0, config.renew_deadline_seconds / 3))

    @property
    def config(self) -> LeaseConfig:
        return self._config

    def stop_leading(self, why: str) -> None:
        global _current
        cfg = self._config
        log.error("Lost the Lease %s/%s (%s); stopping", cfg.namespace, cfg.name, why)
        for handler in logging.getLogger().handlers:
            handler.flush()
        if _current is self:
            _current = None
        self._on_lost()

    def is_fresh(self) -> bool:
        renewed = self._renewed_at
        return renewed is not None and \
            self._clock() - renewed < self._config.renew_deadline_seconds

    def _spec(self, acquired: bool) -> dict[str, Any]:
        now = _format(_now())
        spec = {"holderIdentity": self._config.identity, "renewTime": now,
                "leaseDurationSeconds": max(1, round(self._config.duration_seconds))}
        return spec | ({"acquireTime": now} if acquired else {})

    def try_acquire_or_renew(self) -> bool:
        """True when this replica holds the Lease now, False when another one does; raises on
        an API error or a conflict (:class:`LeaseConflict`), which the caller retries."""
        cfg = self._config
        started = self._clock()
        try:
            lease = self._api.read_namespaced_lease(cfg.name, cfg.namespace,
                                                    _preload_content=False,
                                                    _request_timeout=self._timeout)
        except ApiException as error:
            if error.status != 404:
                raise
            body = {"metadata": {"name": cfg.name, "namespace": cfg.namespace},
                    "spec": self._spec(acquired=True)}
            try:
                self._api.create_namespaced_lease(
                    cfg.namespace, body, _request_timeout=self._timeout)  # type: ignore[arg-type]
            except ApiException as race:
                if race.status == 409:
                    raise LeaseConflict("the Lease was created by another replica") from race
                raise
            self._renewed_at = started
            return True
        current = json.loads(lease.data)  # type: ignore[attr-defined]
        holder = (current.get("spec") or {}).get("holderIdentity")
        if holder != cfg.identity and not is_expired(current, _now()):
            self._renewed_at = None
            return False
        # resourceVersion makes the takeover conditional: two standbys cannot both win.
        patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                 "spec": self._spec(acquired=holder != cfg.identity)}
        try:
            self._api.patch_namespaced_lease(cfg.name, cfg.namespace, patch,
                                             _content_type=MERGE_PATCH,
                                             _request_timeout=self._timeout)
        except ApiException as conflict:
            if conflict.status == 409:
                raise LeaseConflict("the Lease changed while it was renewed") from conflict
            raise
        self._renewed_at = started
        return True

    async def _attempt(self) -> bool | None:
        """One try on the Lease's own thread: True held, False held by another, None failed."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._lane, self.try_acquire_or_renew)
        except Exception as error:  # retried: one failure never ends the process
            log.warning("Lease %s/%s: %s", self._config.namespace, self._config.name,
                        f"{type(error).__name__}: {error}"[:300])
            return None

    async def acquire(self) -> None:
        global _current
        while not await self._attempt():
            await asyncio.sleep(self._config.retry_period_seconds)
        _current = self
        log.info("Leading as %s (Lease %s/%s)", self._config.identity,
                 self._config.namespace, self._config.name)

    def release(self) -> None:
        """Hand the Lease over at once on a clean stop, instead of making the next wait."""
        global _current
        if _current is self:
            _current = None
        cfg = self._config
        try:
            lease = json.loads(self._api.read_namespaced_lease(  # type: ignore[attr-defined]
                cfg.name, cfg.namespace, _preload_content=False,
                _request_timeout=self._timeout).data)
            if (lease.get("spec") or {}).get("holderIdentity") != cfg.identity:
                return
            patch = {"metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                     "spec": {"holderIdentity": None, "renewTime": None,
                              "leaseDurationSeconds": 1}}
            self._api.patch_namespaced_lease(cfg.name, cfg.namespace, patch,
                                             _content_type=MERGE_PATCH,
                                             _request_timeout=self._timeout)
        except Exception:
            log.warning("Could not release the Lease; a standby takes over when it expires")

    async def keep_renewing(self) -> None:
        """Renew every retry period until the Lease is lost; then stop leading."""
        cfg = self._config
        while True:
            await asyncio.sleep(cfg.retry_period_seconds)
            held = await self._attempt()
            if held or (held is None and self.is_fresh()):
                continue  # a failed renewal is retried until the renew deadline
            self.stop_leading("another replica holds it" if held is False else
                              f"no renewal for {cfg.renew_deadline_seconds:g} s")
            return
