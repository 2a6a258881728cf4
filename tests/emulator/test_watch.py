"""Watches: the initial listing and the later events, with nothing lost in between."""

from __future__ import annotations

import asyncio

import pytest

from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

CONFIGMAPS = "/api/v1/namespaces/ns1/configmaps"


async def test_a_change_made_while_the_listing_streams_is_not_missed(
    emulator_api: EmulatorHttp,
) -> None:
    # A listing too big for the socket buffers keeps the server writing until the client reads
    # on. A change made meanwhile must still arrive: the watch subscribes before it lists.
    count, padding = 200, "x" * 50_000
    for index in range(count):
        await emulator_api.post(
            CONFIGMAPS, {"metadata": {"name": f"cm-{index}"}, "data": {"pad": padding}}
        )

    async with emulator_api.watch(CONFIGMAPS) as events:
        first = await anext(events)
        await emulator_api.patch(f"{CONFIGMAPS}/cm-0", {"data": {"pad": "changed"}})
        rest = [await asyncio.wait_for(anext(events), 5) for _ in range(count)]

    assert first["type"] == "ADDED"
    assert [e["type"] for e in rest[:-1]] == ["ADDED"] * (count - 1)
    assert rest[-1]["type"] == "MODIFIED" and rest[-1]["object"]["data"] == {"pad": "changed"}


async def test_a_watch_from_a_listed_version_gets_only_what_happened_since(
    emulator_api: EmulatorHttp,
) -> None:
    # Kopf lists, then watches from the list's resourceVersion; replaying older states as
    # ADDED would make it act on a stale object (as a real API server never does).
    await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "kept"}})
    await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "doomed"}})
    _, listed = await emulator_api.get(CONFIGMAPS)
    await emulator_api.delete(f"{CONFIGMAPS}/doomed")  # between the list and the watch
    await emulator_api.patch(f"{CONFIGMAPS}/kept", {"data": {"k": "v"}})

    async with emulator_api.watch(
        CONFIGMAPS, resourceVersion=listed["metadata"]["resourceVersion"]
    ) as events:
        seen = [await asyncio.wait_for(anext(events), 5) for _ in range(2)]

    assert [(e["type"], e["object"]["metadata"]["name"]) for e in seen] == [
        ("DELETED", "doomed"),
        ("MODIFIED", "kept"),
    ]


async def test_watch_filters_by_namespace_and_labels(emulator_api: EmulatorHttp) -> None:
    async with emulator_api.watch(CONFIGMAPS, labelSelector="app=x,tier!=db") as events:
        await emulator_api.post(
            "/api/v1/namespaces/default/configmaps",
            {"metadata": {"name": "elsewhere", "labels": {"app": "x"}}},
        )
        await emulator_api.post(
            CONFIGMAPS, {"metadata": {"name": "db", "labels": {"app": "x", "tier": "db"}}}
        )
        await emulator_api.post(
            CONFIGMAPS, {"metadata": {"name": "web", "labels": {"app": "x", "tier": "web"}}}
        )
        event = await asyncio.wait_for(anext(events), 5)

    assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "web")


async def test_list_filters_by_labels_and_fields(emulator_api: EmulatorHttp) -> None:
    for name, labels in (("a", {"app": "x"}), ("b", {"app": "y"}), ("c", {})):
        await emulator_api.post(CONFIGMAPS, {"metadata": {"name": name, "labels": labels}})

    _, by_label = await emulator_api.get(CONFIGMAPS, labelSelector="app")
    _, by_absence = await emulator_api.get(CONFIGMAPS, labelSelector="!app")
    _, by_field = await emulator_api.get(CONFIGMAPS, fieldSelector="metadata.name=b")
    set_based, _ = await emulator_api.get(CONFIGMAPS, labelSelector="app in (x,y)")

    assert [i["metadata"]["name"] for i in by_label["items"]] == ["a", "b"]
    assert [i["metadata"]["name"] for i in by_absence["items"]] == ["c"]
    assert [i["metadata"]["name"] for i in by_field["items"]] == ["b"]
    assert by_label["kind"] == "ConfigMapList" and by_label["metadata"]["resourceVersion"]
    assert set_based == 400  # refused rather than silently ignored


async def test_stopping_the_emulator_ends_open_watches(emulator_api: EmulatorHttp) -> None:
    async with emulator_api.watch(CONFIGMAPS) as events:
        await emulator_api.emulator.end_watches()
        remaining = [event async for event in events]

    assert remaining == []
