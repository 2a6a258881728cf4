"""Custom resources are served from their CRD, and the CRD object itself is there for Kopf."""

from __future__ import annotations

import pytest
from minicpm_speech_emulator import running_emulator
from minicpm_speech_operator import assets

from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

GROUP = "serving.minicpm-speech.io"


async def test_discovery_describes_the_custom_resource(emulator_api: EmulatorHttp) -> None:
    _, groups = await emulator_api.get("/apis")
    _, resources = await emulator_api.get(f"/apis/{GROUP}/v1alpha1")

    assert GROUP in [group["name"] for group in groups["groups"]]
    by_name = {resource["name"]: resource for resource in resources["resources"]}
    assert set(by_name) == {"minicpmspeeches", "minicpmspeeches/status"}
    speeches = by_name["minicpmspeeches"]
    assert speeches["kind"] == "MiniCPMSpeech" and speeches["singularName"] == "minicpmspeech"
    assert speeches["namespaced"] is True and speeches["shortNames"] == ["mcs"]
    assert {"get", "list", "watch", "create", "patch", "update", "delete"} <= set(speeches["verbs"])


async def test_the_crd_object_is_stored_and_established(emulator_api: EmulatorHttp) -> None:
    _, crds = await emulator_api.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")

    [crd] = crds["items"]
    assert crd["metadata"]["name"] == f"minicpmspeeches.{GROUP}"
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions["Established"] == "True"


async def test_a_crd_created_through_the_api_is_served(emulator_api: EmulatorHttp) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }
    before, _ = await emulator_api.get("/apis/example.com/v1/widgets")
    await emulator_api.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    status, widget = await emulator_api.post(
        "/apis/example.com/v1/widgets", {"metadata": {"name": "w"}}
    )

    assert before == 404
    assert status == 201 and "namespace" not in widget["metadata"]


async def test_kopf_peering_resources_are_served(emulator_api: EmulatorHttp) -> None:
    _, resources = await emulator_api.get("/apis/kopf.dev/v1")

    scopes = {r["name"]: r["namespaced"] for r in resources["resources"]}
    assert scopes == {"kopfpeerings": True, "clusterkopfpeerings": False}


@pytest.mark.skipif(not assets.crd_path().exists(), reason="the chart's CRD is not written yet")
async def test_the_chart_crd_is_served_as_declared() -> None:
    async with running_emulator(assets.crd_path()) as running:
        info = running.emulator.resources[f"{GROUP}/v1alpha1/minicpmspeeches"]

    assert (info.kind, info.namespaced, info.subresources) == ("MiniCPMSpeech", True, {"status"})
