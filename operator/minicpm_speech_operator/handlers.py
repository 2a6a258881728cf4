"""Kopf registrations only: each trigger runs the same reconcile of one resource, and a
failure of it is reported and retried as :mod:`.retries` says."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from typing import Any

import kopf
from minicpm_speech_contract.bounded import API_SERVER_MAX_JSON_DEPTH

from . import kubeapi, metrics, retries
from .diffbase import DigestDiffBaseStorage
from .errors import capped
from .kubeapi import KubeApi
from .kubeconfig import connection_from_environment, load_configuration
from .manifests import GROUP, KIND, MANAGED_BY
from .reconciler import Reconciler

log = logging.getLogger(__name__)

SPEECHES = (GROUP, "v1alpha1", "minicpmspeeches")
CHILDREN = {"app.kubernetes.io/managed-by": MANAGED_BY}
RESYNC_SECONDS = float(os.environ.get("MINICPM_SPEECH_RESYNC_SECONDS", "60"))


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # No cluster-wide scans of Namespaces or CRDs: the chart installs the CRD before the
    # operator starts, so namespaced mode needs no ClusterRole at all.
    settings.scanning.disabled = True
    decode_what_the_api_server_stores()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = DigestDiffBaseStorage()
    settings.posting.level = logging.INFO
    # Kopf's own API calls: bounded, and retried quickly on a transient error.
    settings.networking.connect_timeout = kubeapi.CONNECT_TIMEOUT_S
    settings.networking.request_timeout = kubeapi.READ_TIMEOUT_S
    settings.networking.error_backoffs = [0.5, 1, 2, 4]
    memo.reconciler = Reconciler(KubeApi(load_configuration()), emit=_post_event)
    memo.failure_events = retries.FailureEvents()
    memo.known = set()
    memo.resync = asyncio.get_running_loop().create_task(_resync_forever(memo))


kopf.on.login()(connection_from_environment)


def decode_what_the_api_server_stores() -> None:
    """Any namespace user may store a resource nested as deep as the API server decodes.
    Kopf decodes watch events with the standard json module and deep-copies bodies, both
    bounded by the interpreter's recursion limit (1,000 frames); past it, one such resource
    broke the watch of every resource of its kind. About three frames per level (the copy
    takes two) cover the API server's limit; the spec's own bound then refuses it in status.
    Measured: 10,000 levels decode, copy and encode within a thread's default 8 MiB stack."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 4 * API_SERVER_MAX_JSON_DEPTH))


@kopf.on.resume(*SPEECHES, backoff=retries.OTHER_ERRORS_BACKOFF_S)
@kopf.on.create(*SPEECHES, backoff=retries.OTHER_ERRORS_BACKOFF_S)
@kopf.on.update(*SPEECHES, backoff=retries.OTHER_ERRORS_BACKOFF_S)
async def reconcile_speech(name: str, namespace: str | None, memo: Any, body: kopf.Body,
                           retry: int, **_: Any) -> None:
    await _reconcile(memo, body, namespace or "", name, retry, "reconcile")


@kopf.on.event(*SPEECHES)
async def remember_speech(event: kopf.RawEvent, name: str, namespace: str | None, memo: Any,
                          **_: Any) -> None:
    """Every resource the watch lists or changes, for the resync; forgotten when deleted."""
    key = (namespace or "", name)
    if event.get("type") == "DELETED":
        memo.known.discard(key)
    else:
        memo.known.add(key)


async def _resync_forever(memo: Any) -> None:
    """Reconciles every known resource each RESYNC_SECONDS: this catches what no event
    announces, such as a referenced ConfigMap or Secret created later.

    A loop of its own rather than Kopf's timer: a timer makes Kopf put a finalizer on every
    resource, and a resource with a finalizer cannot be deleted once the operator is gone."""
    while True:
        await asyncio.sleep(RESYNC_SECONDS)
        for namespace, name in sorted(memo.known):
            ref = {"apiVersion": f"{GROUP}/v1alpha1", "kind": KIND,
                   "metadata": {"name": name, "namespace": namespace}}
            # a failure is reported by _reconcile and tried again at the next resync
            with contextlib.suppress(Exception):
                await _reconcile(memo, ref, namespace, name, 0, "resync")


@kopf.on.cleanup()
async def stop_resync(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "resync", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@kopf.on.event("v1", "configmaps", labels=CHILDREN)
@kopf.on.event("v1", "services", labels=CHILDREN)
@kopf.on.event("apps", "v1", "deployments", labels=CHILDREN)
@kopf.on.event("batch", "v1", "jobs", labels=CHILDREN)
async def child_changed(body: kopf.Body, namespace: str | None, memo: Any, **_: Any) -> None:
    """A child edited, deleted or rolled out, or a benchmark Job started or finished:
    converge its owner and refresh its status (a finished Job's pod is read then)."""
    owner = next((ref for ref in body.metadata.get("ownerReferences") or []
                  if ref.get("kind") == KIND and ref.get("controller")), None)
    if owner is None:
        return
    ref = {"apiVersion": f"{GROUP}/v1alpha1", "kind": KIND, "metadata": {
        "name": owner["name"], "namespace": namespace, "uid": owner.get("uid")}}
    # Kopf does not retry an event handler: a transient failure here waits for the
    # resource's own handlers or its resync, and is reported like any other.
    with contextlib.suppress(kopf.TemporaryError):
        await _reconcile(memo, ref, namespace or "", owner["name"], 0, "child change")


async def _reconcile(memo: Any, body: Any, namespace: str, name: str, retry: int,
                     step: str) -> None:
    """One reconcile; a failure leaves a log line and a Warning event on the resource, and a
    transient one is retried by Kopf within seconds (:mod:`.retries`)."""
    try:
        await memo.reconciler.reconcile(namespace, name)
    except Exception as error:
        message = f"{step} failed: {retries.describe(error)}"
        race = retries.is_race(error)
        transient = race or retries.is_transient(error)
        metrics.RETRIES.labels("race" if race else "transient" if transient else "other").inc()
        if race:
            log.info("%s/%s: %s; trying again", namespace, name, message)
        else:
            reason = "ApiUnavailable" if transient else "ReconcileFailed"
            log.warning("%s/%s: %s (retry %d)", namespace, name, message, retry)
            if memo.failure_events.should_post(namespace, name, reason):
                _post_event(body, "Warning", reason, message)
        if transient:
            raise kopf.TemporaryError(message, delay=retries.delay_s(retry)) from error
        raise


def _post_event(body: Any, type_: str, reason: str, message: str) -> None:
    try:
        kopf.event(body, type=type_, reason=reason, message=capped(message))
    except Exception:  # an event is a report; failing to post one never fails a reconcile
        log.exception("could not post a %s event", reason)
