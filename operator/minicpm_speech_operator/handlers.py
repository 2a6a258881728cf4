"""Kopf registrations only: each trigger runs the same reconcile of one resource."""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from . import metrics
from .kubeapi import KubeApi, connection_info, load_configuration
from .manifests import GROUP, KIND, MANAGED_BY
from .reconciler import Reconciler

SPEECHES = (GROUP, "v1alpha1", "minicpmspeeches")
CHILDREN = {"app.kubernetes.io/managed-by": MANAGED_BY}
RESYNC_SECONDS = float(os.environ.get("MINICPM_SPEECH_RESYNC_SECONDS", "60"))
METRICS_PORT = int(os.environ.get("MINICPM_SPEECH_METRICS_PORT", "0"))


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    memo.reconciler = Reconciler(KubeApi(load_configuration()), emit=_post_event)
    if METRICS_PORT:
        metrics.serve(METRICS_PORT)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    return connection_info(load_configuration())  # type: ignore[no-any-return]


@kopf.on.resume(*SPEECHES)
@kopf.on.create(*SPEECHES)
@kopf.on.update(*SPEECHES)
async def reconcile_speech(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    await memo.reconciler.reconcile(namespace or "", name)


@kopf.timer(*SPEECHES, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def resync(name: str, namespace: str | None, memo: Any, **_: Any) -> None:
    """Catches what no event announces: a referenced ConfigMap or Secret created later."""
    await memo.reconciler.reconcile(namespace or "", name)


@kopf.on.event("v1", "configmaps", labels=CHILDREN)
@kopf.on.event("v1", "services", labels=CHILDREN)
@kopf.on.event("apps", "v1", "deployments", labels=CHILDREN)
async def child_changed(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    """A child edited, deleted or rolled out: converge its owner and refresh its status."""
    owner = next(
        (ref["name"] for ref in body.metadata.get("ownerReferences") or []
         if ref.get("kind") == KIND and ref.get("controller")),
        None,
    )
    if owner is not None:
        await memo.reconciler.reconcile(namespace or "", owner)


def _post_event(body: Any, type_: str, reason: str, message: str) -> None:
    kopf.event(body, type=type_, reason=reason, message=message[:1024])
