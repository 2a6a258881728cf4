"""The /api/v1/namespaces routes, which Kopf lists and watches in --namespace mode."""

from __future__ import annotations

import asyncio

import pytest

from tests.harness.cluster import Cluster
from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only


async def test_namespaces_are_listed_and_fetched(emulator_api: EmulatorHttp) -> None:
    status, listed = await emulator_api.get("/api/v1/namespaces")
    fetched_status, fetched = await emulator_api.get("/api/v1/namespaces/ns1")
    missing_status, _ = await emulator_api.get("/api/v1/namespaces/nope")

    assert status == 200
    assert [item["metadata"]["name"] for item in listed["items"]] == ["default", "ns1"]
    assert fetched_status == 200 and fetched["status"] == {"phase": "Active"}
    assert "namespace" not in fetched["metadata"]
    assert missing_status == 404


async def test_namespaces_are_watched_and_created(emulator_api: EmulatorHttp) -> None:
    async with emulator_api.watch("/api/v1/namespaces") as events:
        seeded = [await anext(events) for _ in range(2)]
        status, _ = await emulator_api.post("/api/v1/namespaces", {"metadata": {"name": "ns2"}})
        added = await asyncio.wait_for(anext(events), 5)

    assert [e["object"]["metadata"]["name"] for e in seeded] == ["default", "ns1"]
    assert (
        status == 201 and added["type"] == "ADDED" and added["object"]["metadata"]["name"] == "ns2"
    )


async def test_deleting_a_namespace_deletes_what_it_holds(emulator_api: EmulatorHttp) -> None:
    await emulator_api.post("/api/v1/namespaces/ns1/configmaps", {"metadata": {"name": "inside"}})
    await emulator_api.post(
        "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "outside"}}
    )

    status, _ = await emulator_api.delete("/api/v1/namespaces/ns1")

    assert status == 200
    assert (await emulator_api.get("/api/v1/namespaces/ns1/configmaps/inside"))[0] == 404
    assert (await emulator_api.get("/api/v1/namespaces/default/configmaps/outside"))[0] == 200


def test_the_official_client_lists_namespaces(cluster: Cluster) -> None:
    names = [ns.metadata.name for ns in cluster.api.core.list_namespace().items if ns.metadata]

    assert names == ["default", cluster.namespace]
