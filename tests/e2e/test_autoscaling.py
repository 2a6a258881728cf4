"""Autoscaling: the operator owns a HorizontalPodAutoscaler and leaves the Deployment's replicas
to it, across every kind of reconcile, until autoscaling is turned off.

The emulator runs no HPA controller, so the test scales the Deployment as one would. On a real
cluster (KUBECONFIG) the HPA controller runs too, but without the Prometheus Adapter's metric it
holds the count it finds within minReplicas..maxReplicas, so the same steps hold there.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from minicpm_speech_contract.pod_metrics import ACTIVE_STREAMS

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .conftest import RESYNC_SECONDS
from .journey import (
    HASH_LABEL,
    NAME,
    condition,
    create_and_settle,
    event_reasons,
    example_spec,
    settled,
    versions,
)

HPA = "horizontalpodautoscaler"


def autoscaled_spec() -> dict[str, Any]:
    return example_spec("autoscaling.yaml")


def replicas(cluster: Cluster) -> int | None:
    deployment = cluster.api.get("deployment", NAME) or {}
    count = (deployment.get("spec") or {}).get("replicas")
    return count if isinstance(count, int) else None


def scaled_status(cluster: Cluster) -> dict[str, Any]:
    status = ((cluster.api.get_speech(NAME) or {}).get("status") or {}).get("autoscaling")
    return dict(status or {})


def deployment_writes(cluster: Cluster) -> list[tuple[str, Any]]:
    """What the operator sent to the Deployment, its server-side dry runs included: (verb,
    body) of each create, patch and update."""
    return [(r.verb, r.body) for r in cluster.request_log()
            if r.resource == "deployments" and r.verb in ("create", "patch", "update")]


async def scale_as_the_autoscaler_would(cluster: Cluster, count: int) -> None:
    cluster.api.patch("deployment", NAME, {"spec": {"replicas": count}})
    await cluster.wait_for(lambda: scaled_status(cluster).get("desiredReplicas") == count,
                           message=f"status.autoscaling.desiredReplicas is {count}")


async def test_the_autoscaler_owns_the_replicas_until_autoscaling_is_off(
        cluster: Cluster, operator: Operator) -> None:
    speech = await create_and_settle(cluster, autoscaled_spec())
    hpa = await cluster.wait_for(lambda: cluster.api.get(HPA, NAME), message="the HPA exists")
    (owner,) = hpa["metadata"]["ownerReferences"]
    assert owner["uid"] == speech["metadata"]["uid"] and owner["controller"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == NAME
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == ACTIVE_STREAMS
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    assert replicas(cluster) == 1  # minReplicas, written when the Deployment was created
    await cluster.wait_for(lambda: "AutoscalingEnabled" in event_reasons(cluster),
                           message="an AutoscalingEnabled event")

    await scale_as_the_autoscaler_would(cluster, 3)
    assert cluster.api.get_speech(NAME)["status"]["replicas"] == 3  # type: ignore[index]
    await cluster.wait_for(lambda: "Scaled" in event_reasons(cluster),
                           message="a Scaled event on the resource")

    # Reconciles of every kind: a new target (the HPA is patched), a new profile (the pod
    # template is patched), and the periodic resyncs.
    cluster.api.patch_speech(NAME, {"spec": {"autoscaling": {"maxReplicas": 5, "target": 10}}})
    await cluster.wait_for(settled(cluster))
    await cluster.wait_for(lambda: (cluster.api.get(HPA, NAME) or {}).get("spec", {}).get(
        "maxReplicas") == 5, message="the HPA patched")
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "low-latency"}}})
    new_hash = (await cluster.wait_for(settled(cluster)))["status"]["configHash"]
    await cluster.wait_for(lambda: (cluster.api.get("deployment", NAME) or {})["spec"][
        "template"]["metadata"]["annotations"][HASH_LABEL] == new_hash,
        message="the pod template rolled to the new profile")
    await asyncio.sleep(float(RESYNC_SECONDS) * 2.5)
    assert replicas(cluster) == 3
    writes = deployment_writes(cluster)
    if cluster.is_emulated:
        creates = [body for verb, body in writes if verb == "create"]
        assert creates and all(body["spec"]["replicas"] == 1 for body in creates)
        assert len(writes) > len(creates), "the new profile patched the Deployment"
        touched = [body for verb, body in writes
                   if verb != "create" and "replicas" in (body.get("spec") or {})]
        assert touched == [], f"writes of spec.replicas while autoscaling was on: {touched}"

    cluster.api.patch_speech(NAME, {"spec": {"replicas": 2, "autoscaling": {"enabled": False}}})
    await cluster.wait_for(settled(cluster))
    await cluster.wait_for(lambda: cluster.api.get(HPA, NAME) is None, message="HPA deleted")
    await cluster.wait_for(lambda: replicas(cluster) == 2, message="replicas follow the spec")
    await cluster.wait_for(lambda: "AutoscalingDisabled" in event_reasons(cluster),
                           message="an AutoscalingDisabled event")
    assert "autoscaling" not in cluster.api.get_speech(NAME)["status"]  # type: ignore[index]
    # And the spec is the owner again: a hand-edited count is restored.
    cluster.api.patch("deployment", NAME, {"spec": {"replicas": 4}})
    await cluster.wait_for(lambda: replicas(cluster) == 2, message="drift repaired")


async def test_a_deleted_autoscaler_is_restored(cluster: Cluster, operator: Operator) -> None:
    await create_and_settle(cluster, autoscaled_spec())
    await cluster.wait_for(lambda: cluster.api.get(HPA, NAME), message="the HPA exists")
    cluster.api.delete(HPA, NAME)
    await cluster.wait_for(lambda: cluster.api.get(HPA, NAME), timeout=float(RESYNC_SECONDS) * 5,
                           message="the HPA restored by the resync")


def with_autoscaling(**changes: Any) -> dict[str, Any]:
    spec = autoscaled_spec()
    spec["autoscaling"] = {**spec["autoscaling"], **changes}
    return spec


BAD_AUTOSCALING: dict[str, tuple[dict[str, Any], str]] = {
    "fewer at most than at least": (with_autoscaling(minReplicas=3, maxReplicas=2),
                                    "spec.autoscaling.maxReplicas"),
    "a margin a listener hears as gaps": (with_autoscaling(metric="realTimeMargin", target=0.5),
                                          "spec.autoscaling.target"),
    "no most": ({**autoscaled_spec(), "autoscaling": {"enabled": True, "target": 8}},
                "spec.autoscaling.maxReplicas"),
    "a benchmark that scales to zero": ({**autoscaled_spec(), "perf": {
        "placement": "maintenance"}}, "spec.perf.placement"),
}


@pytest.mark.parametrize("case", sorted(BAD_AUTOSCALING))
async def test_bad_autoscaling_is_refused_and_changes_nothing(cluster: Cluster,
                                                              operator: Operator,
                                                              case: str) -> None:
    bad, field = BAD_AUTOSCALING[case]
    await create_and_settle(cluster, autoscaled_spec())
    await cluster.wait_for(lambda: cluster.api.get(HPA, NAME), message="the HPA exists")
    await scale_as_the_autoscaler_would(cluster, 2)
    hpa_version = cluster.api.get(HPA, NAME)["metadata"]["resourceVersion"]  # type: ignore[index]
    before = versions(cluster)
    spec = copy.deepcopy(bad)
    if not cluster.is_emulated:
        # A real API server evaluates the CRD's CEL rules and refuses the change itself.
        with pytest.raises(ApiException) as refused:
            cluster.api.patch("minicpmspeech", NAME, [{"op": "replace", "path": "/spec",
                                                       "value": spec}])
        assert refused.value.status == 422 and field.rpartition(".")[2] in str(
            refused.value.body)
    else:
        cluster.api.patch("minicpmspeech", NAME, [{"op": "replace", "path": "/spec",
                                                   "value": spec}])
        speech = await cluster.wait_for(settled(cluster))
        degraded = condition(speech, "Degraded")
        assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
        assert degraded["message"].startswith(f"{field}: "), degraded["message"]
        assert speech["status"]["autoscaling"]["maxReplicas"] == 4  # what still runs
        await asyncio.sleep(float(RESYNC_SECONDS) * 1.5)
    assert versions(cluster) == before
    assert cluster.api.get(HPA, NAME)["metadata"]["resourceVersion"] == hpa_version  # type: ignore[index]
    assert replicas(cluster) == 2
