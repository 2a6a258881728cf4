"""Pure status computation: what `kubectl get mcs` and the conditions say, and why."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .autoscaling import Autoscaling, target_quantity
from .errors import InvalidSpec, capped

READY, PROGRESSING, DEGRADED = "Ready", "Progressing", "Degraded"


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool | None  # None: Unknown, e.g. a gate whose numbers are not in yet
    reason: str
    message: str

    @property
    def rendered_status(self) -> str:
        return {True: "True", False: "False", None: "Unknown"}[self.status]


def condition_from(raw: Mapping[str, Any]) -> Condition:
    status = {"True": True, "False": False}.get(raw.get("status", ""))
    return Condition(raw["type"], status, raw.get("reason", ""), raw.get("message", ""))


@dataclass(frozen=True, slots=True)
class PerfView:
    """What the benchmark adds to the status: status.perf, its conditions, and a failed
    gate (a problem the user must look at, so it degrades the resource)."""

    status: Mapping[str, Any] | None
    conditions: tuple[Condition, ...] = ()
    gate_problem: Condition | None = None
    maintenance: str | None = None  # why serving is scaled to zero, while it is


@dataclass(frozen=True, slots=True)
class Served:
    """What the resource serves now: set when the spec was valid, kept when it is not."""

    profile: str
    config_hash: str
    endpoint: str
    configmap: str


def rollout_conditions(deployment: Mapping[str, Any] | None, replicas: int) -> list[Condition]:
    """Ready and Progressing read off the Deployment the operator owns."""
    if deployment is None:
        return [
            Condition(READY, False, "NoDeployment", "The serving Deployment does not exist yet"),
            Condition(PROGRESSING, True, "Creating", "Creating the serving Deployment"),
        ]
    status = deployment.get("status") or {}
    ready = status.get("readyReplicas", 0)
    updated = status.get("updatedReplicas", 0)
    observed = status.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
    if replicas == 0:
        return [
            Condition(READY, False, "ScaledToZero", "spec.replicas is 0"),
            Condition(PROGRESSING, False, "ScaledToZero", "No pods are wanted"),
        ]
    if _deadline_exceeded(status):
        return [
            Condition(READY, ready >= replicas, "RolloutStuck",
                      f"{ready}/{replicas} pods ready; the rollout exceeded its deadline"),
            Condition(PROGRESSING, False, "RolloutStuck",
                      "Pods did not pass warm-up within spec.runtime.startupTimeoutSeconds"),
        ]
    if observed and updated >= replicas and ready >= replicas:
        return [
            Condition(READY, True, "WarmedUp",
                      f"{ready}/{replicas} pods warmed up, graphs captured, serving"),
            Condition(PROGRESSING, False, "Complete", "The current configuration is rolled out"),
        ]
    return [
        Condition(READY, False, "WaitingForWarmup",
                  f"{ready}/{replicas} pods ready; pods report ready only after warm-up"),
        Condition(PROGRESSING, True, "RollingOut",
                  f"{updated}/{replicas} pods run the current configuration"),
    ]


def _deadline_exceeded(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Progressing" and c.get("reason") == "ProgressDeadlineExceeded"
        for c in status.get("conditions") or []
    )


def degraded_condition(invalid: InvalidSpec | None, rollout: list[Condition],
                       gate_problem: Condition | None = None) -> Condition:
    if invalid is not None:
        return Condition(DEGRADED, True, invalid.reason, str(invalid))
    stuck = next((c for c in rollout if c.reason == "RolloutStuck"), None)
    if stuck is not None:
        return Condition(DEGRADED, True, stuck.reason, stuck.message)
    if gate_problem is not None:
        return gate_problem
    return Condition(DEGRADED, False, "AsExpected", "No problem found")


def maintenance_conditions(message: str) -> list[Condition]:
    return [
        Condition(READY, False, "BenchmarkMaintenance", message),
        Condition(PROGRESSING, True, "BenchmarkMaintenance", message),
    ]


def phase_of(conditions: list[Condition]) -> str:
    by_type = {c.type: c for c in conditions}
    if by_type[DEGRADED].status:
        return "Degraded"
    if by_type[READY].status:
        return "Ready"
    if by_type[PROGRESSING].status:
        return "Progressing"
    return "Pending"


def build_status(
    *,
    generation: int,
    served: Served | None,
    deployment: Mapping[str, Any] | None,
    replicas: int,
    invalid: InvalidSpec | None,
    previous: Mapping[str, Any],
    now: str,
    perf: PerfView | None = None,
    autoscaling: Mapping[str, Any] | None = None,
    search: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    perf = perf or PerfView(None)
    rollout = rollout_conditions(deployment, replicas)
    if perf.maintenance is not None:
        rollout = maintenance_conditions(perf.maintenance)
    if invalid is not None:
        # A refused spec changes nothing that runs; the rollout is not progressing.
        rollout = [c if c.type != PROGRESSING else
                   Condition(PROGRESSING, False, invalid.reason, "The new spec was refused")
                   for c in rollout]
    conditions = [*rollout, degraded_condition(invalid, rollout, perf.gate_problem)]
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": phase_of(conditions),
        "replicas": replicas,
        "readyReplicas": ((deployment or {}).get("status") or {}).get("readyReplicas", 0),
        "conditions": _with_transition_times(
            [*conditions, *perf.conditions], previous, generation, now),
        # null removes a stale status.perf (merge patch) once perf is off.
        "perf": dict(perf.status) if perf.status is not None else None,
        "autoscaling": dict(autoscaling) if autoscaling is not None else None,
        "profileSearch": dict(search) if search is not None else None,
    }
    if served is not None:
        status |= {
            "profile": served.profile,
            "configHash": served.config_hash,
            "endpoint": served.endpoint,
            "deployConfigMap": served.configmap,
        }
    return status


def _with_transition_times(
    conditions: list[Condition], previous: Mapping[str, Any], generation: int, now: str
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous.get("conditions") or []}
    rendered = []
    for condition in conditions:
        status = condition.rendered_status
        old = before.get(condition.type, {})
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        rendered.append({
            "type": condition.type,
            "status": status,
            "reason": condition.reason,
            "message": capped(condition.message),
            "observedGeneration": generation,
            "lastTransitionTime": since or now,
        })
    return rendered


def autoscaling_status(scaling: Autoscaling, name: str,
                       deployment: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """status.autoscaling: what the HorizontalPodAutoscaler was told, and the replicas it set
    on the Deployment (``desiredReplicas``) beside the pods the Deployment has."""
    if not scaling.enabled:
        return None
    deployment = deployment or {}
    status = {
        "horizontalPodAutoscaler": name,
        "minReplicas": scaling.min_replicas,
        "maxReplicas": scaling.max_replicas,
        "metric": scaling.metric,
        "target": scaling.target,
        "podMetric": scaling.pod_metric.name,
        "podMetricTarget": target_quantity(scaling),
        "currentReplicas": (deployment.get("status") or {}).get("replicas", 0),
    }
    desired = (deployment.get("spec") or {}).get("replicas")
    if isinstance(desired, int):
        status["desiredReplicas"] = desired
    return status


def served_from(previous: Mapping[str, Any]) -> Served | None:
    """What a resource served before, read back from its status."""
    if not previous.get("configHash"):
        return None
    return Served(
        profile=previous.get("profile", ""),
        config_hash=previous["configHash"],
        endpoint=previous.get("endpoint", ""),
        configmap=previous.get("deployConfigMap", ""),
    )


def find_condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The condition of that type in a status (a Kubernetes object's, not only ours); {} if none."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})
