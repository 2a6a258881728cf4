"""One level-triggered reconcile: read the resource, converge its children, report.

Every trigger (create, update, resume after restart, a child changed or deleted, the
periodic resync) runs the same function, so a retry never repeats a finished step and
a restart mid-way converges without duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import metrics
from .apply import ChildConflict, Retired, apply, apply_all, is_controlled_by
from .errors import InvalidSpec, capped
from .kubeapi import AlreadyExists, KubeApi
from .manifests import (
    CONFIG_HASH_KEY,
    HPA_OWNED,
    Owner,
    build_children,
    configmap_name,
    endpoint_url,
    owner_of,
)
from .names import check_children, check_resource_name
from .perf.jobs import (
    JobRequest,
    build_job,
    build_job_configmap,
    job_name,
    label_selector,
    perf_selector,
)
from .perf.lastgood import build_lastgood_configmap, lastgood_from_configmap, lastgood_name
from .perf.plan import Observed, PerfPlan, plan
from .perf.results import attempt_of, newest_pod, read_result, to_read
from .perf.search import SearchPlan, candidates, decide, slo_condition
from .serving_config import ServingConfig, check_token_secret, profile_document, serving_config
from .spec import SpeechSpec, parse_spec
from .status import (
    PerfView,
    Served,
    autoscaling_status,
    build_status,
    condition_from,
    find_condition,
    rollout_conditions,
    served_from,
)

log = logging.getLogger(__name__)
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
            log.info("%s", decision_line(namespace, name, outcome))
            return outcome

    async def _reconcile(self, namespace: str, name: str) -> Outcome:
        body = await self._api.get_speech(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return Outcome("gone")
        owner, previous = owner_of(body), body.get("status") or {}
        try:
            check_resource_name(owner.name)
            spec = parse_spec(body.get("spec"))
            cfg = await self._serving_config(namespace, spec)
        except InvalidSpec as invalid:
            metrics.FAILURES.labels(invalid.reason).inc()
            return await self._refuse(body, owner, invalid)
        perf, search, chosen = await self._perf_plan(owner, spec, cfg, previous)
        # A failed gate with rollback on serves the last good config; the spec stays.
        serve_spec, serve_cfg = perf.serve or chosen
        slo = slo_condition(spec.slo, perf.view.status, search)
        view = perf.view if slo is None else dataclasses.replace(
            perf.view, conditions=(*perf.view.conditions, slo))
        changes: list[tuple[str, str, str]] = []
        deployment = None
        try:
            children = build_children(owner, serve_spec, serve_cfg)
            check_children(children)  # what the operator knows the server would refuse
            for child in children:
                if child["kind"] == "Deployment" and perf.scale_to_zero:
                    # Only the count: the strategy stays the one for the user's replicas.
                    child["spec"]["replicas"] = 0
            # All or none: what the server or its admission would refuse stops here, before
            # the first write, the benchmark Jobs included.
            await self._rehearse_jobs(owner, _job_requests(perf, search))
            scaled = serve_spec.autoscaling.enabled
            applied, retired = await apply_all(
                self._api, children, owner.uid, create_only=HPA_OWNED if scaled else None,
                # Looked for even when autoscaling was never on: the cluster, not the status,
                # says whether an autoscaler of this resource is left.
                retire=() if scaled else (
                    Retired("HorizontalPodAutoscaler", owner.namespace, owner.name),))
            for child, (live, action) in zip(children, applied, strict=True):
                changes.append((child["kind"], child["metadata"]["name"], action))
                if child["kind"] == "Deployment":
                    deployment = live
            changes += [(gone.kind, gone.name, "deleted") for gone in retired]
            events = await self._carry_out(owner, perf, search)
        except InvalidSpec as conflict:
            metrics.FAILURES.labels(conflict.reason).inc()
            return await self._refuse(body, owner, conflict)
        served = Served(serve_cfg.profile_label, serve_cfg.config_hash,
                        endpoint_url(owner, serve_spec), configmap_name(owner))
        status = build_status(
            generation=body["metadata"].get("generation", 0), served=served,
            deployment=deployment,
            replicas=0 if perf.scale_to_zero else wanted_replicas(spec, deployment),
            invalid=None, previous=previous, now=self._clock(), perf=view,
            autoscaling=autoscaling_status(spec.autoscaling, owner.name, deployment),
            search=search.status if search is not None else None,
        )
        await self._publish(body, status, changes, events)
        return Outcome("ok", changes, status)

    async def _perf_plan(
        self, owner: Owner, spec: SpeechSpec, cfg: ServingConfig, previous: Mapping[str, Any],
    ) -> tuple[PerfPlan, SearchPlan | None, tuple[SpeechSpec, ServingConfig]]:
        """Read what the benchmark and the profile search need from the cluster, then decide
        (perf.search.decide, then perf.plan.plan for the configuration chosen to serve)."""
        ns, enabled = owner.namespace, spec.perf.enabled
        if not enabled and not previous.get("perf"):
            return plan(spec, cfg, Observed((), {}, None, False), None), None, (spec, cfg)
        searching = enabled and spec.profile.search.enabled
        found = candidates(spec, cfg) if searching else ()
        jobs = await self._api.list("Job", ns, label_selector(perf_selector(owner)))
        attempts = tuple(a for job in jobs
                         if is_controlled_by(job, owner.uid) and (a := attempt_of(job)))
        results, last_good, ready = {}, None, False
        search, chosen = None, (spec, cfg)
        if enabled:
            hashes = sorted({cfg.config_hash, *(c.config_hash for c in found if c.cfg)})
            for attempt in (a for h in hashes for a in to_read(attempts, h)):
                pods = await self._api.list("Pod", ns, f"job-name={attempt.name}")
                results[attempt.name] = read_result(attempt, newest_pod(pods))
            record = await self._api.get("ConfigMap", ns, lastgood_name(owner))
            if record is not None and is_controlled_by(record, owner.uid):
                last_good = lastgood_from_configmap(record)
            if searching:
                search = decide(spec, found, attempts, results,
                                last_good.config_hash if last_good else None)
                if search.serve is not None and search.serve.spec and search.serve.cfg:
                    chosen = (search.serve.spec, search.serve.cfg)
            if spec.perf.placement == "live":
                deployment = await self._api.get("Deployment", ns, owner.name)
                ready = _serves(deployment, cfg.config_hash, wanted_replicas(spec, deployment))
        seen = Observed(attempts, results, last_good, ready,
                        search.protected if search is not None else frozenset())
        return plan(*chosen, seen, previous.get("perf")), search, chosen

    async def _carry_out(self, owner: Owner, perf: PerfPlan,
                         search: SearchPlan | None) -> list[tuple[str, str, str]]:
        """Delete what is superseded first (it frees GPUs), then start what is missing."""
        events = []
        for name, why in perf.delete:
            if await self._api.delete("Job", owner.namespace, name):
                events.append(("Normal", "JobDeleted", f"Job {name} deleted: {why}"))
        notes = {f"{r.config_hash}/{r.kind}": perf.retry_notes[r.kind]
                 for r in perf.create if r.kind in perf.retry_notes}
        notes |= (search.retry_notes or {}) if search is not None else {}
        for request in _job_requests(perf, search):
            uid, created = await self._ensure_job(owner, request)
            await self._ensure_job_config(owner, request, uid)
            name = job_name(owner, request.kind, request.config_hash, request.attempt)
            note = notes.get(f"{request.config_hash}/{request.kind}")
            if created and note:
                events.append(("Warning", "BenchmarkRetried",
                               f"Job {name} created, attempt {request.attempt}, after " + note))
            elif created:
                events.append(("Normal", "BenchmarkStarted",
                               f"Job {name} created ({request.kind} of {request.config_hash},"
                               f" attempt {request.attempt})"))
        for request in perf.running + (search.running if search is not None else ()):
            live = await self._api.get("Job", owner.namespace, job_name(
                owner, request.kind, request.config_hash, request.attempt))
            if live is not None:
                await self._ensure_job_config(owner, request, live["metadata"]["uid"])
        if perf.record is not None:
            await apply(self._api, build_lastgood_configmap(owner, perf.record), owner.uid)
        return events

    async def _rehearse_jobs(self, owner: Owner, requests: tuple[JobRequest, ...]) -> None:
        for request in requests:
            job = build_job(owner, request)
            if await self._api.get("Job", owner.namespace, job["metadata"]["name"]) is None:
                with contextlib.suppress(AlreadyExists):
                    await self._api.create(job, dry_run=True)

    async def _ensure_job(self, owner: Owner, request: JobRequest) -> tuple[str, bool]:
        """Look up by name before creating: a restart never starts a second Job."""
        job = build_job(owner, request)
        name = job["metadata"]["name"]
        live = await self._api.get("Job", owner.namespace, name)
        created = False
        if live is None:
            try:
                live, created = await self._api.create(job), True
            except AlreadyExists:
                live = await self._api.get("Job", owner.namespace, name)
        if live is None or not is_controlled_by(live, owner.uid):
            raise ChildConflict(f"Job {name}", "exists and is not controlled by this "
                                "MiniCPMSpeech", "Delete or rename that Job")
        return live["metadata"]["uid"], created

    async def _ensure_job_config(self, owner: Owner, request: JobRequest, uid: str) -> None:
        configmap = build_job_configmap(owner, request, uid)
        meta = configmap["metadata"]
        if await self._api.get("ConfigMap", meta["namespace"], meta["name"]) is None:
            # Never rewritten: the running Job may already have read it.
            with contextlib.suppress(AlreadyExists):
                await self._api.create(configmap)

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
            previous=previous, now=self._clock(), perf=_kept_perf(previous),
            autoscaling=previous.get("autoscaling"), search=previous.get("profileSearch"),
        )
        await self._publish(body, status, [])
        return Outcome("invalid", [], status)

    async def _publish(
        self, body: dict[str, Any], status: dict[str, Any], changes: list[tuple[str, str, str]],
        events: list[tuple[str, str, str]] | None = None,
    ) -> None:
        previous = body.get("status") or {}
        for kind, name, action in changes:
            if action != "unchanged":
                metrics.CHILD_CHANGES.labels(kind, action).inc()
                self._emit(body, "Normal", action.capitalize(), f"{kind} {name} {action}")
        for event in [*(events or []), *transition_events(previous, status)]:
            self._emit(body, *event)
        if status != {key: previous.get(key) for key in status}:
            meta = body["metadata"]
            patch = {**status, **{key: with_removals(previous.get(key), status.get(key))
                                  for key in ("perf", "autoscaling", "profileSearch")}}
            await self._api.patch_speech_status(meta["namespace"], meta["name"], patch)


def decision_line(namespace: str, name: str, outcome: Outcome) -> str:
    """One line per reconcile, ``key=value`` so that a log query can pick it apart: what was
    decided, each child created or patched, how many were unchanged, and why a spec was
    refused."""
    acted = [f"{action}={kind}/{child}" for kind, child, action in outcome.changes
             if action != "unchanged"]
    unchanged = sum(action == "unchanged" for _, _, action in outcome.changes)
    parts = [f"resource={namespace}/{name}", f"result={outcome.result}", *acted]
    if outcome.changes:
        parts.append(f"unchanged={unchanged}")
    if outcome.result == "invalid":
        degraded = find_condition(outcome.status, "Degraded")
        parts.append(f"reason={degraded.get('reason', '')}")
        parts.append(f"message={json.dumps(degraded.get('message', ''))}")
    return capped(" ".join(parts))


def with_removals(old: Any, new: Any) -> Any:
    """``new`` as a merge patch over ``old``: keys that ``new`` dropped are set to null, at
    every depth, or a merge patch would leave a stale result behind."""
    if not isinstance(new, Mapping) or not isinstance(old, Mapping):
        return new
    patch = {key: with_removals(old.get(key), value) for key, value in new.items()}
    patch.update({key: None for key in old if key not in new})
    return patch


def _job_requests(perf: PerfPlan, search: SearchPlan | None) -> tuple[JobRequest, ...]:
    """The plan's Jobs for what serves, then the search's for its next candidate."""
    return perf.create + (search.create if search is not None else ())


def wanted_replicas(spec: SpeechSpec, deployment: Mapping[str, Any] | None) -> int:
    """The serving pods the resource wants now: spec.replicas, or while autoscaling is on
    the count the HorizontalPodAutoscaler last gave the Deployment."""
    if not spec.autoscaling.enabled:
        return spec.replicas
    scaled = ((deployment or {}).get("spec") or {}).get("replicas")
    return scaled if isinstance(scaled, int) else spec.autoscaling.min_replicas


def _serves(deployment: Mapping[str, Any] | None, config_hash: str, replicas: int) -> bool:
    """Every replica runs ``config_hash`` and has warmed up: a live benchmark may start."""
    if deployment is None:
        return False
    labels = deployment["metadata"].get("labels") or {}
    ready = rollout_conditions(deployment, replicas)[0]
    return labels.get(CONFIG_HASH_KEY) == config_hash and bool(ready.status)


def _kept_perf(previous: Mapping[str, Any]) -> PerfView:
    """A refused spec changes nothing: the benchmark's status and conditions stay as they were."""
    kept = ("Benchmarked", "PerfGate", "QualityGate", "RolledBack", "Maintenance", "SLO")
    conditions = tuple(condition_from(c) for c in previous.get("conditions") or []
                       if c.get("type") in kept)
    return PerfView(previous.get("perf"), conditions)


def transition_events(
    previous: Mapping[str, Any], status: Mapping[str, Any]
) -> list[tuple[str, str, str]]:
    """(type, reason, message) for each change a user would want in `kubectl describe`."""
    events = []
    old_hash, new_hash = previous.get("configHash"), status.get("configHash")
    if new_hash and old_hash != new_hash:
        events.append(("Normal", "ConfigChanged",
                       f"Serving config {old_hash or 'none'} -> {new_hash} ({status['profile']})"))
    old_degraded = find_condition(previous, "Degraded")
    new_degraded = find_condition(status, "Degraded")
    if new_degraded.get("status") == "True" and (
        old_degraded.get("message") != new_degraded.get("message")
    ):
        events.append(("Warning", new_degraded["reason"], new_degraded["message"]))
    old_bench = find_condition(previous, "Benchmarked")
    new_bench = find_condition(status, "Benchmarked")
    if new_bench.get("reason") not in (None, "Running", "Waiting") and (
            old_bench.get("status"), old_bench.get("reason")) != (new_bench["status"],
                                                                  new_bench["reason"]):
        kind = "Normal" if new_bench["status"] == "True" else "Warning"
        events.append((kind, "Benchmarked" if kind == "Normal" else new_bench["reason"],
                       f"{(status.get('perf') or {}).get('configHash')}: {new_bench['message']}"))
    events += autoscaling_events(previous.get("autoscaling"), status.get("autoscaling"),
                                 status.get("replicas"))
    events += search_events(previous.get("profileSearch"), status.get("profileSearch"))
    if previous.get("phase") != status.get("phase"):
        kind = "Warning" if status["phase"] == "Degraded" else "Normal"
        message = find_condition(status, "Ready").get("message", "")
        if status["phase"] == "Degraded":
            # The Ready message alone ("serving") would hide that the new spec was refused.
            why = ("the new spec was refused and nothing changed"
                   if new_degraded.get("reason") == "InvalidSpec" else "see the Degraded condition")
            message = f"{new_degraded.get('reason')}: {why}; meanwhile {message}"
        events.append((kind, f"Phase{status['phase']}", message))
    return events


def autoscaling_events(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
                       replicas: Any) -> list[tuple[str, str, str]]:
    """Autoscaling turned on, retargeted or off, and each count the autoscaler set, as
    `kubectl describe` should tell it. The HPA's own events stay on the HPA, which a user
    reading the resource does not look at."""
    if not new:
        if not old:
            return []
        return [("Normal", "AutoscalingDisabled",
                 f"HorizontalPodAutoscaler {old.get('horizontalPodAutoscaler')} deleted; the "
                 f"Deployment follows spec.replicas ({replicas}) again")]
    events = []
    keys = ("minReplicas", "maxReplicas", "metric", "target")
    if not old or any(old.get(key) != new.get(key) for key in keys):
        events.append((
            "Normal", "AutoscalingEnabled" if not old else "AutoscalingChanged",
            f"HorizontalPodAutoscaler {new['horizontalPodAutoscaler']} scales the Deployment "
            f"from {new['minReplicas']} to {new['maxReplicas']} pods on {new['metric']} "
            f"{new['target']:g} ({new['podMetric']} at {new['podMetricTarget']} per pod); "
            "the operator no longer writes its replicas"))
    before, after = (old or {}).get("desiredReplicas"), new.get("desiredReplicas")
    if isinstance(before, int) and isinstance(after, int) and before != after:
        direction = "up" if after > before else "down"
        events.append((
            "Normal", "Scaled",
            f"HorizontalPodAutoscaler {new['horizontalPodAutoscaler']} scaled the Deployment "
            f"{direction} from {before} to {after} pods on {new['metric']} (target "
            f"{new['target']:g})" + ("; leaving pods drain their live streams first"
                                     if direction == "down" else "")))
    return events


def search_events(old: Mapping[str, Any] | None,
                  new: Mapping[str, Any] | None) -> list[tuple[str, str, str]]:
    """A profile search started, or decided: a winner, or no candidate meeting the SLO."""
    old = old or {}
    if not new or (old.get("phase"), old.get("winnerConfigHash")) == (
            new.get("phase"), new.get("winnerConfigHash")):
        return []
    message = str(new.get("message", ""))
    if new["phase"] == "Searching":
        return [("Normal", "ProfileSearchStarted",
                 f"Benchmarking {len(new.get('candidates') or [])} candidate profiles against "
                 f"spec.slo, one at a time: {message}")]
    if new["phase"] == "Chosen":
        return [("Normal", "ProfileChosen", message)]
    return [("Warning", "NoCandidateMeetsSlo", message)]
