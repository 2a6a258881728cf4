"""Deletion as a real cluster does it: finalizers hold an object, owners take their dependents."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

CONFIGMAPS = "/api/v1/namespaces/ns1/configmaps"
SPEECHES = "/apis/serving.minicpm-speech.io/v1alpha1/namespaces/ns1/minicpmspeeches"


def owned_by(owner: dict[str, Any]) -> list[dict[str, Any]]:
    meta = owner["metadata"]
    return [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": meta["name"],
            "uid": meta["uid"],
        }
    ]


async def create_owner(emulator_api: EmulatorHttp, **metadata: Any) -> dict[str, Any]:
    body = {
        "apiVersion": "serving.minicpm-speech.io/v1alpha1",
        "kind": "MiniCPMSpeech",
        "metadata": {"name": "owner", **metadata},
        "spec": {},
    }
    status, owner = await emulator_api.post(SPEECHES, body)
    assert status == 201
    created: dict[str, Any] = owner
    return created


async def test_finalizers_hold_the_object_until_the_last_one_is_removed(
    emulator_api: EmulatorHttp,
) -> None:
    await create_owner(emulator_api, finalizers=["a.example.com/x", "b.example.com/y"])

    status, deleting = await emulator_api.delete(f"{SPEECHES}/owner")
    assert status == 200 and deleting["metadata"]["deletionTimestamp"]
    assert (await emulator_api.get(f"{SPEECHES}/owner"))[0] == 200

    await emulator_api.patch(f"{SPEECHES}/owner", {"metadata": {"finalizers": ["b.example.com/y"]}})
    assert (await emulator_api.get(f"{SPEECHES}/owner"))[0] == 200

    await emulator_api.patch(f"{SPEECHES}/owner", {"metadata": {"finalizers": None}})
    assert (await emulator_api.get(f"{SPEECHES}/owner"))[0] == 404


async def test_deleting_an_owner_deletes_its_dependents_with_watch_events(
    emulator_api: EmulatorHttp,
) -> None:
    owner = await create_owner(emulator_api)
    for name in ("child-1", "child-2"):
        await emulator_api.post(
            CONFIGMAPS, {"metadata": {"name": name, "ownerReferences": owned_by(owner)}}
        )
    await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "unrelated"}})

    async with emulator_api.watch(CONFIGMAPS) as events:
        initial = [await anext(events) for _ in range(3)]
        await emulator_api.delete(f"{SPEECHES}/owner")
        deleted = [await asyncio.wait_for(anext(events), 5) for _ in range(2)]

    assert {e["type"] for e in initial} == {"ADDED"}
    assert {(e["type"], e["object"]["metadata"]["name"]) for e in deleted} == {
        ("DELETED", "child-1"),
        ("DELETED", "child-2"),
    }
    _, remaining = await emulator_api.get(CONFIGMAPS)
    assert [item["metadata"]["name"] for item in remaining["items"]] == ["unrelated"]


async def test_dependents_wait_for_the_owner_finalizers(emulator_api: EmulatorHttp) -> None:
    owner = await create_owner(emulator_api, finalizers=["kopf.zalando.org/KopfFinalizerMarker"])
    await emulator_api.post(
        CONFIGMAPS, {"metadata": {"name": "child", "ownerReferences": owned_by(owner)}}
    )

    await emulator_api.delete(f"{SPEECHES}/owner")
    assert (await emulator_api.get(f"{CONFIGMAPS}/child"))[0] == 200

    await emulator_api.patch(f"{SPEECHES}/owner", {"metadata": {"finalizers": []}})
    assert (await emulator_api.get(f"{CONFIGMAPS}/child"))[0] == 404


async def test_cascades_go_down_every_level_and_respect_finalizers(
    emulator_api: EmulatorHttp,
) -> None:
    owner = await create_owner(emulator_api)
    _, child = await emulator_api.post(
        "/apis/apps/v1/namespaces/ns1/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "child", "ownerReferences": owned_by(owner)},
        },
    )
    grandchild = {
        "name": "grandchild",
        "ownerReferences": owned_by(child),
        "finalizers": ["x.example.com/y"],
    }
    await emulator_api.post(CONFIGMAPS, {"metadata": grandchild})

    await emulator_api.delete(f"{SPEECHES}/owner")

    assert (await emulator_api.get("/apis/apps/v1/namespaces/ns1/deployments/child"))[0] == 404
    status, held = await emulator_api.get(f"{CONFIGMAPS}/grandchild")
    assert status == 200 and held["metadata"]["deletionTimestamp"]


async def test_orphan_propagation_keeps_the_dependents(emulator_api: EmulatorHttp) -> None:
    owner = await create_owner(emulator_api)
    await emulator_api.post(
        CONFIGMAPS, {"metadata": {"name": "child", "ownerReferences": owned_by(owner)}}
    )

    await emulator_api.delete(f"{SPEECHES}/owner", {"propagationPolicy": "Orphan"})

    assert (await emulator_api.get(f"{CONFIGMAPS}/child"))[0] == 200


async def test_a_dependent_of_a_gone_owner_is_collected(emulator_api: EmulatorHttp) -> None:
    gone = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "gone",
        "uid": "00000000-0000-0000-0000-000000000000",
    }
    status, _ = await emulator_api.post(
        CONFIGMAPS, {"metadata": {"name": "orphan", "ownerReferences": [gone]}}
    )

    assert status == 201
    assert (await emulator_api.get(f"{CONFIGMAPS}/orphan"))[0] == 404


async def test_deleting_a_missing_object_is_not_found(emulator_api: EmulatorHttp) -> None:
    status, reply = await emulator_api.delete(f"{CONFIGMAPS}/nothing")

    assert status == 404 and reply["kind"] == "Status"
