"""Kopf registrations only: each trigger runs the same reconcile of one resource."""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from .kubeapi import KubeApi
from .kubeconfig import connection_from_environment, load_configuration
from .manifests import GROUP, KIND, MANAGED_BY
from .reconciler import Reconciler

SPEECHES = (GROUP, "v1alpha1", "minicpmspeeches")
CHILDREN = {"app.kubernetes.io/managed-by": MANAGED_BY}
RESYNC_SECONDS = float(os.environ.get("MINICPM_SPEECH_RESYNC_SECONDS", "60"))


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # No cluster-wide scans of Namespaces or CRDs: the chart installs the CRD before the
    # operator starts, so namespaced mode needs no ClusterRole at all.
    settings.scanning.disabled = True
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.posting.level = logging.INFO
    memo.reconciler = Reconciler(KubeApi(load_configuration()), emit=_post_event)


kopf.on.login()(connection_from_environment)


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
@kopf.on.event("batch", "v1", "jobs", labels=CHILDREN)
async def child_changed(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    """A child edited, deleted or rolled out, or a benchmark Job started or finished:
    converge its owner and refresh its status (a finished Job's pod is read then)."""
    owner = next(
        (ref["name"] for ref in body.metadata.get("ownerReferences") or []
         if ref.get("kind") == KIND and ref.get("controller")),
        None,
    )
    if owner is not None:
        await memo.reconciler.reconcile(namespace or "", owner)


def _post_event(body: Any, type_: str, reason: str, message: str) -> None:
    kopf.event(body, type=type_, reason=reason, message=message[:1024])
