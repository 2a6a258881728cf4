"""Optimistic concurrency: stale writes are refused and change nothing."""

from __future__ import annotations

import pytest

from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

CONFIGMAPS = "/api/v1/namespaces/ns1/configmaps"


async def test_merge_patch_with_a_stale_resource_version_conflicts(
    emulator_api: EmulatorHttp,
) -> None:
    _, created = await emulator_api.post(
        CONFIGMAPS, {"metadata": {"name": "a"}, "data": {"k": "1"}}
    )
    stale = created["metadata"]["resourceVersion"]
    await emulator_api.patch(f"{CONFIGMAPS}/a", {"data": {"k": "2"}})  # someone else writes

    status, reply = await emulator_api.patch(
        f"{CONFIGMAPS}/a", {"metadata": {"resourceVersion": stale}, "data": {"k": "3"}}
    )

    assert status == 409 and reply["reason"] == "Conflict"
    _, current = await emulator_api.get(f"{CONFIGMAPS}/a")
    assert current["data"] == {"k": "2"}


async def test_merge_patch_with_the_current_resource_version_applies(
    emulator_api: EmulatorHttp,
) -> None:
    _, created = await emulator_api.post(
        CONFIGMAPS, {"metadata": {"name": "a"}, "data": {"k": "1"}}
    )
    current = created["metadata"]["resourceVersion"]

    status, patched = await emulator_api.patch(
        f"{CONFIGMAPS}/a", {"metadata": {"resourceVersion": current}, "data": {"k": "3"}}
    )

    assert status == 200 and patched["data"] == {"k": "3"}


async def test_json_patch_whose_test_fails_is_refused_whole(emulator_api: EmulatorHttp) -> None:
    # This is how Kopf adds and removes its finalizers.
    _, created = await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "a"}})
    await emulator_api.patch(f"{CONFIGMAPS}/a", {"data": {"k": "2"}})
    ops = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": created["metadata"]["resourceVersion"],
        },
        {
            "op": "add",
            "path": "/metadata/finalizers",
            "value": ["kopf.zalando.org/KopfFinalizerMarker"],
        },
    ]

    status, reply = await emulator_api.patch(f"{CONFIGMAPS}/a", ops, patch="json")

    assert status == 422 and reply["kind"] == "Status"
    _, current = await emulator_api.get(f"{CONFIGMAPS}/a")
    assert "finalizers" not in current["metadata"]


async def test_json_patch_whose_test_passes_applies(emulator_api: EmulatorHttp) -> None:
    _, created = await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "a"}})
    ops = [
        {
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": created["metadata"]["resourceVersion"],
        },
        {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/cleanup"]},
    ]

    status, patched = await emulator_api.patch(f"{CONFIGMAPS}/a", ops, patch="json")

    assert status == 200 and patched["metadata"]["finalizers"] == ["example.com/cleanup"]


async def test_put_replaces_the_object_and_checks_its_version(emulator_api: EmulatorHttp) -> None:
    _, created = await emulator_api.post(
        CONFIGMAPS, {"metadata": {"name": "a"}, "data": {"k": "1"}}
    )
    replacement = {
        "metadata": {"name": "a", "resourceVersion": created["metadata"]["resourceVersion"]}
    }

    status, replaced = await emulator_api.request(
        "PUT", f"{CONFIGMAPS}/a", {**replacement, "data": {"j": "2"}}
    )
    stale_status, _ = await emulator_api.request("PUT", f"{CONFIGMAPS}/a", replacement)

    assert status == 200 and replaced["data"] == {"j": "2"}
    assert replaced["metadata"]["uid"] == created["metadata"]["uid"]
    assert stale_status == 409
