"""spec.autoscaling: which pod metric scales the serving Deployment, and the rules a choice obeys.

The engine is a ``HorizontalPodAutoscaler`` (autoscaling/v2) on a ``Pods`` metric served by
the Prometheus Adapter, built in :func:`.manifests.build_hpa`. Not a KEDA ``ScaledObject``:

* the HPA is a built-in API, so the API server validates it against Kubernetes' own schema
  (the tests do too, strictly) and every cluster serves it; a ScaledObject needs KEDA's CRDs
  and its operator running, a second controller to install, upgrade and grant rights to;
* KEDA's main gain over an HPA is scaling to and from zero, which a GPU pod must never do: its
  model load and CUDA-graph warm-up take minutes, so a request arriving at zero replicas would
  wait that long. ``minReplicas`` is at least 1 for the same reason;
* KEDA itself scales through an HPA it creates, with the same behaviour fields; the only thing
  it would add here is its Prometheus query, which the Prometheus Adapter's rule provides.

The operator owns the HPA (an owner reference, like every child) and, while autoscaling is on,
never writes the Deployment's ``spec.replicas``: that count is the HPA's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, Literal

from minicpm_speech_contract.pod_metrics import ACTIVE_STREAMS, QUEUED_STREAMS, REAL_TIME_FACTOR

from .errors import InvalidSpec

Metric = Literal["activeStreams", "queuedStreams", "realTimeMargin"]

# A margin below 1 is a stream falling behind its listener; above 10 the target's reciprocal
# (what the HPA compares, see PodMetric) would be finer than the milli-unit a quantity keeps.
MARGIN_MIN, MARGIN_MAX = 1, 10
# The CRD states the same bounds (a test holds its text to this one).
MARGIN_RULE = (f"!has(self.target) || self.metric != 'realTimeMargin' || "
               f"(double(self.target) >= {MARGIN_MIN}.0 && double(self.target) <= {MARGIN_MAX}.0)")


@dataclass(frozen=True, slots=True)
class PodMetric:
    """What the HPA reads for one spec.autoscaling.metric, and whether the user's target is
    inverted first: an HPA adds pods when the average rises above the target, and only the
    real-time margin falls as load rises."""

    name: str
    inverted: bool
    what: str


POD_METRICS: dict[str, PodMetric] = {
    "activeStreams": PodMetric(ACTIVE_STREAMS, False, "average active streams per pod"),
    "queuedStreams": PodMetric(QUEUED_STREAMS, False, "average queued streams per pod"),
    # The reciprocal of the margin, exported by the pod: 0 when idle, where the margin itself
    # is infinite and an average of it would say nothing. Target margin m -> factor 1/m.
    "realTimeMargin": PodMetric(REAL_TIME_FACTOR, True,
                                "worst stream's real-time margin (as its real-time factor)"),
}


@dataclass(frozen=True, slots=True)
class Autoscaling:
    enabled: bool
    min_replicas: int
    max_replicas: int | None
    metric: Metric
    target: float | None

    @property
    def pod_metric(self) -> PodMetric:
        return POD_METRICS[self.metric]


def parse_autoscaling(raw: Mapping[str, Any]) -> Autoscaling:
    target = raw.get("target")
    return Autoscaling(
        enabled=raw["enabled"],
        min_replicas=raw["minReplicas"],
        max_replicas=raw.get("maxReplicas"),
        metric=raw["metric"],
        target=float(target) if target is not None else None,
    )


def check_autoscaling(scaling: Autoscaling) -> None:
    """The CRD's CEL rules on spec.autoscaling, checked here too (an older API server, a dry run
    or the emulator may not evaluate them). Checked while disabled as well, so that enabling it
    later cannot turn an accepted spec into a refused one for a field it did not touch."""
    field = "spec.autoscaling"
    if scaling.max_replicas is not None and scaling.max_replicas < scaling.min_replicas:
        raise InvalidSpec(
            f"{field}.maxReplicas",
            f"{scaling.max_replicas} is below spec.autoscaling.minReplicas "
            f"{scaling.min_replicas}",
            f"Raise maxReplicas to at least {scaling.min_replicas} or lower minReplicas",
        )
    if scaling.target is not None and scaling.metric == "realTimeMargin" and not (
            MARGIN_MIN <= scaling.target <= MARGIN_MAX):
        raise InvalidSpec(
            f"{field}.target",
            f"{scaling.target:g} is not a real-time margin from {MARGIN_MIN} to {MARGIN_MAX}",
            "Give the audio seconds per wall second the slowest stream must keep, e.g. 1.5 "
            "(below 1 a listener hears gaps)",
        )
    if not scaling.enabled:
        return
    if scaling.max_replicas is None:
        raise InvalidSpec(f"{field}.maxReplicas", "is required when spec.autoscaling.enabled "
                          "is true", "Set the most serving pods (GPUs) autoscaling may use")
    if scaling.target is None:
        raise InvalidSpec(f"{field}.target", "is required when spec.autoscaling.enabled is "
                          "true", f"Set the value of {scaling.metric} to scale at, e.g. "
                          f"{_EXAMPLE_TARGETS[scaling.metric]}")


_EXAMPLE_TARGETS = {"activeStreams": "8", "queuedStreams": "1", "realTimeMargin": "1.5"}


def target_quantity(scaling: Autoscaling) -> str:
    """The HPA's ``averageValue``, a Kubernetes quantity in milli-units (``1500m``), of the
    user's target or, for an inverted metric, of its reciprocal."""
    assert scaling.target is not None
    value = Decimal(str(scaling.target))
    if scaling.pod_metric.inverted:
        value = 1 / value
    milli = int((value * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))
    return str(milli // 1000) if milli % 1000 == 0 else f"{max(milli, 1)}m"
