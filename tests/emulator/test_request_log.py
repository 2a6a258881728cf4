"""The request log names every API request as an RBAC rule would."""

from __future__ import annotations

import pytest
from minicpm_speech_emulator import ApiRequest

from tests.harness.cluster import Cluster
from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

GROUP = "serving.minicpm-speech.io"
SPEECHES = f"/apis/{GROUP}/v1alpha1/namespaces/ns1/minicpmspeeches"


def rule(entry: ApiRequest) -> tuple[str, str, str, str | None, str | None]:
    return (entry.verb, entry.group, entry.resource, entry.subresource, entry.namespace)


async def test_verbs_groups_resources_and_subresources(emulator_api: EmulatorHttp) -> None:
    speech = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "MiniCPMSpeech", "metadata": {"name": "s"}}
    await emulator_api.get("/apis")  # discovery: not a resource request
    await emulator_api.get("/api/v1/namespaces")
    await emulator_api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
    await emulator_api.post(SPEECHES, speech)
    await emulator_api.get(f"{SPEECHES}/s")
    await emulator_api.patch(f"{SPEECHES}/s/status", {"status": {"phase": "Ready"}})
    await emulator_api.request("PUT", f"{SPEECHES}/s", speech)
    async with emulator_api.watch("/apis/apps/v1/namespaces/ns1/deployments"):
        pass
    await emulator_api.post("/api/v1/namespaces/ns1/events", {"metadata": {"generateName": "e-"}})
    await emulator_api.delete(f"{SPEECHES}/s")
    await emulator_api.delete("/api/v1/namespaces/ns1/configmaps")

    assert [rule(entry) for entry in emulator_api.emulator.request_log()] == [
        ("list", "", "namespaces", None, None),
        ("list", "apiextensions.k8s.io", "customresourcedefinitions", None, None),
        ("create", GROUP, "minicpmspeeches", None, "ns1"),
        ("get", GROUP, "minicpmspeeches", None, "ns1"),
        ("patch", GROUP, "minicpmspeeches", "status", "ns1"),
        ("update", GROUP, "minicpmspeeches", None, "ns1"),
        ("watch", "apps", "deployments", None, "ns1"),
        ("create", "", "events", None, "ns1"),
        ("delete", GROUP, "minicpmspeeches", None, "ns1"),
        ("deletecollection", "", "configmaps", None, "ns1"),
    ]


def test_the_cluster_log_leaves_out_the_harness_own_requests(cluster: Cluster) -> None:
    cluster.api.create("configmap", {"metadata": {"name": "mine"}})
    assert cluster.request_log() == []

    everything = cluster.request_log(include_harness=True)
    assert [(e.verb, e.resource, e.name) for e in everything] == [("create", "configmaps", None)]


async def test_a_write_keeps_what_it_sent(emulator_api: EmulatorHttp) -> None:
    """So a test can tell which fields a client wrote, e.g. that no patch touched replicas."""
    hpas = "/apis/autoscaling/v2/namespaces/ns1/horizontalpodautoscalers"
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "h"}, "spec": {"maxReplicas": 2, "scaleTargetRef": {
               "apiVersion": "apps/v1", "kind": "Deployment", "name": "d"}}}
    await emulator_api.post(hpas, hpa)
    await emulator_api.patch(f"{hpas}/h", {"spec": {"maxReplicas": 3}})
    await emulator_api.get(f"{hpas}/h")
    create, patch, get = emulator_api.emulator.request_log()
    assert (create.group, create.resource, create.body) == (
        "autoscaling", "horizontalpodautoscalers", hpa)
    assert (patch.verb, patch.body) == ("patch", {"spec": {"maxReplicas": 3}})
    assert (get.verb, get.body) == ("get", None)


async def test_a_dry_run_is_marked(emulator_api: EmulatorHttp) -> None:
    await emulator_api.post("/api/v1/namespaces/ns1/configmaps?dryRun=All",
                            {"metadata": {"name": "c"}})
    await emulator_api.post("/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "c"}})
    assert [r.dry_run for r in emulator_api.emulator.request_log()] == [True, False]
