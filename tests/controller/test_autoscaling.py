"""spec.autoscaling: the HorizontalPodAutoscaler it renders, the rules a spec obeys (judged alike by
the CRD's CEL rules and by the operator), and the replicas the operator leaves to the HPA."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from minicpm_speech_contract import pod_metrics
from minicpm_speech_operator import autoscaling
from minicpm_speech_operator.apply import Retired, apply_all, merge_patch, plan, stale_keys
from minicpm_speech_operator.crd_schema import version_schema
from minicpm_speech_operator.errors import InvalidSpec
from minicpm_speech_operator.manifests import HPA_OWNED
from minicpm_speech_operator.reconciler import autoscaling_events
from minicpm_speech_operator.spec import parse_spec
from minicpm_speech_operator.status import autoscaling_status

from .builders import claim_spec
from .test_manifests import KUBERNETES_VERSION, render
from .test_names_and_rules import rules, server_refusals, with_spec


def scaled(**fields: Any) -> dict[str, Any]:
    return {**claim_spec(), "autoscaling": {"enabled": True, "maxReplicas": 4, "target": 8,
                                            **fields}}


def autoscaling_schema() -> dict[str, Any]:
    node: dict[str, Any] = version_schema()["properties"]["spec"]["properties"]["autoscaling"]
    return node


# --- the rendered autoscaler ------------------------------------------------------------

@pytest.mark.parametrize("metric", sorted(autoscaling.POD_METRICS))
def test_the_autoscaler_is_valid_in_strict_mode(metric: str) -> None:
    target = 1.5 if metric == "realTimeMargin" else 8
    children = render(scaled(metric=metric, target=target, minReplicas=2))
    for child in children.values():
        kubernetes_validate.validate(child, KUBERNETES_VERSION, strict=True)
    hpa = children["HorizontalPodAutoscaler"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": children["Deployment"]["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 4)
    assert hpa["metadata"]["ownerReferences"] == children["Deployment"]["metadata"][
        "ownerReferences"]


@pytest.mark.parametrize(("metric", "target", "name", "quantity"), [
    ("activeStreams", 8, pod_metrics.ACTIVE_STREAMS, "8"),
    ("activeStreams", 2.5, pod_metrics.ACTIVE_STREAMS, "2500m"),
    ("queuedStreams", 0.5, pod_metrics.QUEUED_STREAMS, "500m"),
    # The margin falls as load rises: the HPA holds its reciprocal, the real-time factor.
    ("realTimeMargin", 1.5, pod_metrics.REAL_TIME_FACTOR, "667m"),
    ("realTimeMargin", 2, pod_metrics.REAL_TIME_FACTOR, "500m"),
    ("realTimeMargin", 1, pod_metrics.REAL_TIME_FACTOR, "1"),
    ("realTimeMargin", 10, pod_metrics.REAL_TIME_FACTOR, "100m"),
])
def test_each_metric_is_a_per_pod_average(metric: str, target: float, name: str,
                                          quantity: str) -> None:
    (scaler,) = render(scaled(metric=metric, target=target))["HorizontalPodAutoscaler"][
        "spec"]["metrics"]
    assert scaler == {"type": "Pods", "pods": {"metric": {"name": name}, "target": {
        "type": "AverageValue", "averageValue": quantity}}}


def test_scale_down_is_slow_and_one_pod_at_a_time() -> None:
    behavior = render(scaled())["HorizontalPodAutoscaler"]["spec"]["behavior"]
    down = behavior["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 300
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 300}]
    assert "scaleUp" not in behavior  # the HPA's default: scale-up is never held back


def test_without_autoscaling_there_is_no_autoscaler() -> None:
    assert "HorizontalPodAutoscaler" not in render(claim_spec())
    assert "HorizontalPodAutoscaler" not in render(scaled(enabled=False))


def test_an_autoscaled_deployment_starts_at_min_and_rolls_without_a_spare_gpu() -> None:
    deployment = render({**scaled(minReplicas=2, maxReplicas=6), "replicas": 1})["Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0,
                                                                "maxUnavailable": 1}


# --- the spec's rules -------------------------------------------------------------------

def test_defaults_leave_autoscaling_off_at_one_replica() -> None:
    scaling = parse_spec(claim_spec()).autoscaling
    assert (scaling.enabled, scaling.min_replicas, scaling.metric) == (False, 1, "activeStreams")
    assert "never zero" in autoscaling_schema()["properties"]["minReplicas"]["description"]


@pytest.mark.parametrize(("spec", "field", "words"), [
    (scaled(minReplicas=3, maxReplicas=2), "spec.autoscaling.maxReplicas", "below"),
    ({**claim_spec(), "autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
     "spec.autoscaling.maxReplicas", "below"),
    ({**claim_spec(), "autoscaling": {"enabled": True, "target": 8}},
     "spec.autoscaling.maxReplicas", "required"),
    ({**claim_spec(), "autoscaling": {"enabled": True, "maxReplicas": 3}},
     "spec.autoscaling.target", "required"),
    (scaled(metric="realTimeMargin", target=0.8), "spec.autoscaling.target", "real-time margin"),
    (scaled(metric="realTimeMargin", target=12), "spec.autoscaling.target", "real-time margin"),
    ({**scaled(), "perf": {"placement": "maintenance"}}, "spec.perf.placement",
     "HorizontalPodAutoscaler owns the replicas"),
])
def test_bad_autoscaling_is_refused_naming_the_field(spec: dict[str, Any], field: str,
                                                     words: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(spec)
    assert refused.value.field == field and words in refused.value.message, refused.value
    refusals = server_refusals(with_spec(spec))
    assert len(refusals) == 1 and field.rpartition(".")[2] in refusals[0], refusals


@pytest.mark.parametrize(("spec", "field"), [
    (scaled(minReplicas=0), "spec.autoscaling.minReplicas"),
    (scaled(maxReplicas=65), "spec.autoscaling.maxReplicas"),
    (scaled(target=0), "spec.autoscaling.target"),
    (scaled(metric="gpuUtilisation"), "spec.autoscaling.metric"),
])
def test_out_of_range_values_are_refused_by_the_schema(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(spec)
    assert refused.value.field == field
    assert server_refusals(with_spec(spec)) == [field]


@pytest.mark.parametrize("spec", [
    scaled(),
    scaled(minReplicas=4, maxReplicas=4),
    scaled(metric="realTimeMargin", target=1),
    scaled(metric="realTimeMargin", target=10),
    scaled(metric="queuedStreams", target=0.5),
    {**claim_spec(), "autoscaling": {"enabled": False}},
    {**claim_spec(), "autoscaling": {"enabled": False, "metric": "realTimeMargin"}},
    {**scaled(), "replicas": 0, "perf": {"placement": "live"}},
    {**scaled(enabled=False), "perf": {"placement": "maintenance"}},
])
def test_good_autoscaling_is_accepted(spec: dict[str, Any]) -> None:
    parse_spec(spec)
    assert server_refusals(with_spec(spec)) == []


def test_the_crd_states_the_margin_bounds_the_operator_checks() -> None:
    by_rule = {rule["rule"]: rule for rule in autoscaling_schema()["x-kubernetes-validations"]}
    assert autoscaling.MARGIN_RULE in by_rule
    for rule in rules(autoscaling_schema()).values():
        assert rule["message"].startswith("spec.autoscaling.")
        assert rule["fieldPath"].strip(".") in autoscaling_schema()["properties"]


# --- the replicas are the autoscaler's --------------------------------------------------

class FakeApi:
    """Objects by (kind, name); every write recorded."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.objects = {(o["kind"], o["metadata"]["name"]): copy.deepcopy(o) for o in objects}
        self.writes: list[tuple[str, str, Any, bool]] = []

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.objects.get((kind, name)))

    async def create(self, body: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        self.writes.append(("create", body["kind"], body, dry_run))
        if not dry_run:
            self.objects[(body["kind"], body["metadata"]["name"])] = copy.deepcopy(body)
        return body

    async def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any],
                    dry_run: bool = False) -> Any:
        self.writes.append(("patch", kind, patch, dry_run))
        return self.objects[(kind, name)]

    async def delete(self, kind: str, namespace: str, name: str) -> bool:
        self.writes.append(("delete", kind, name, False))
        return self.objects.pop((kind, name), None) is not None


def live_copy(child: dict[str, Any], replicas: int | None = None) -> dict[str, Any]:
    live = copy.deepcopy(child)
    if replicas is not None:
        live["spec"]["replicas"] = replicas
    return live


async def test_an_update_never_writes_the_replicas_the_autoscaler_set() -> None:
    children = render(scaled(minReplicas=1, maxReplicas=8))
    deployment = children["Deployment"]
    api = FakeApi(live_copy(deployment, replicas=5))
    unchanged = await plan(api, deployment, "uid-1", HPA_OWNED)  # type: ignore[arg-type]
    assert unchanged.patch is None  # 5 pods is not drift
    # A profile change patches the pod template, and still not the count.
    changed = copy.deepcopy(deployment)
    changed["spec"]["template"]["metadata"]["annotations"]["x"] = "y"
    write = await plan(api, changed, "uid-1", HPA_OWNED)  # type: ignore[arg-type]
    assert write.patch is not None and "replicas" not in write.patch["spec"]
    assert changed["spec"]["replicas"] == 1  # the rendered object is left as it was


async def test_turning_autoscaling_off_deletes_the_autoscaler_before_writing_replicas() -> None:
    on = render(scaled(maxReplicas=8))
    off = render({**claim_spec(), "replicas": 2})
    api = FakeApi(live_copy(on["Deployment"], replicas=6), on["HorizontalPodAutoscaler"])
    retire = (Retired("HorizontalPodAutoscaler", "voices", "speech"),)
    applied, retired = await apply_all(api, [off["Deployment"]], "uid-1",  # type: ignore[arg-type]
                                       retire=retire)
    assert retired == list(retire) and applied[0][1] == "updated"
    real = [(verb, kind, body) for verb, kind, body, dry in api.writes if not dry]
    assert [(verb, kind) for verb, kind, _ in real] == [
        ("delete", "HorizontalPodAutoscaler"), ("patch", "Deployment")]
    assert real[1][2]["spec"]["replicas"] == 2


async def test_an_autoscaler_of_someone_else_is_never_deleted() -> None:
    foreign = render(scaled())["HorizontalPodAutoscaler"]
    foreign["metadata"]["ownerReferences"] = []
    api = FakeApi(foreign)
    _, retired = await apply_all(api, [], "uid-1",  # type: ignore[arg-type]
                                 retire=(Retired("HorizontalPodAutoscaler", "voices", "speech"),))
    assert retired == [] and api.writes == []


def test_a_switch_back_to_one_pod_drops_the_rolling_update() -> None:
    many = render(scaled(maxReplicas=4))["Deployment"]
    one = render(claim_spec())["Deployment"]
    assert stale_keys(one, many) == {("spec", "strategy"): ["rollingUpdate"]}
    assert merge_patch(one, many)["spec"]["strategy"] == {"type": "Recreate",
                                                          "rollingUpdate": None}


# --- status and events ------------------------------------------------------------------

def test_status_reports_the_autoscaler_and_the_deployments_count() -> None:
    scaling = parse_spec(scaled(metric="realTimeMargin", target=1.5)).autoscaling
    deployment = {"spec": {"replicas": 3}, "status": {"replicas": 2}}
    status = autoscaling_status(scaling, "speech", deployment)
    assert status == {"horizontalPodAutoscaler": "speech", "minReplicas": 1, "maxReplicas": 4,
                      "metric": "realTimeMargin", "target": 1.5,
                      "podMetric": pod_metrics.REAL_TIME_FACTOR, "podMetricTarget": "667m",
                      "currentReplicas": 2, "desiredReplicas": 3}
    assert autoscaling_status(parse_spec(claim_spec()).autoscaling, "speech", None) is None


def test_events_say_when_autoscaling_turns_on_changes_and_turns_off() -> None:
    on = autoscaling_status(parse_spec(scaled()).autoscaling, "speech", None)
    wider = autoscaling_status(parse_spec(scaled(maxReplicas=6)).autoscaling, "speech", None)
    (enabled,) = autoscaling_events(None, on, 1)
    assert enabled[1] == "AutoscalingEnabled" and "from 1 to 4 pods on activeStreams 8" in (
        enabled[2])
    assert autoscaling_events(on, dict(on or {}, currentReplicas=3), 3) == []
    # The count the HPA set on the Deployment, up and down; none when it was not known before.
    two, three = dict(on or {}, desiredReplicas=2), dict(on or {}, desiredReplicas=3)
    assert autoscaling_events(on, two, 2) == []
    (up,) = autoscaling_events(two, three, 3)
    assert up[1] == "Scaled" and "up from 2 to 3 pods on activeStreams" in up[2]
    (down,) = autoscaling_events(three, two, 2)
    assert down[1] == "Scaled" and "down from 3 to 2" in down[2] and "drain" in down[2]
    assert autoscaling_events(three, three, 3) == []
    assert autoscaling_events(on, wider, 1)[0][1] == "AutoscalingChanged"
    (disabled,) = autoscaling_events(on, None, 2)
    assert disabled[1] == "AutoscalingDisabled" and "spec.replicas (2)" in disabled[2]
    assert autoscaling_events(None, None, 1) == []

