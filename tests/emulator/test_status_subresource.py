"""The status subresource and the main object are written separately."""

from __future__ import annotations

import pytest

from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

SPEECHES = "/apis/serving.minicpm-speech.io/v1alpha1/namespaces/ns1/minicpmspeeches"
SPEECH = {
    "apiVersion": "serving.minicpm-speech.io/v1alpha1",
    "kind": "MiniCPMSpeech",
    "metadata": {"name": "s"},
    "spec": {"replicas": 1},
}


async def test_status_patch_changes_only_the_status(emulator_api: EmulatorHttp) -> None:
    await emulator_api.post(SPEECHES, SPEECH)

    _, patched = await emulator_api.patch(
        f"{SPEECHES}/s/status",
        {
            "metadata": {"labels": {"sneaky": "yes"}},
            "spec": {"replicas": 5},
            "status": {"phase": "Ready"},
        },
    )

    assert patched["status"] == {"phase": "Ready"}
    assert patched["spec"] == {"replicas": 1}
    assert "labels" not in patched["metadata"]


async def test_main_object_patch_ignores_the_status(emulator_api: EmulatorHttp) -> None:
    await emulator_api.post(SPEECHES, SPEECH)
    await emulator_api.patch(f"{SPEECHES}/s/status", {"status": {"phase": "Ready"}})

    _, patched = await emulator_api.patch(
        f"{SPEECHES}/s", {"spec": {"replicas": 2}, "status": {"phase": "Lost"}}
    )

    assert patched["spec"] == {"replicas": 2}
    assert patched["status"] == {"phase": "Ready"}


async def test_status_on_create_is_ignored(emulator_api: EmulatorHttp) -> None:
    _, created = await emulator_api.post(SPEECHES, {**SPEECH, "status": {"phase": "Ready"}})

    assert "status" not in created


async def test_json_patch_on_status_is_checked_and_kept_to_status(
    emulator_api: EmulatorHttp,
) -> None:
    # Kopf writes its progress into status this way.
    _, created = await emulator_api.post(SPEECHES, SPEECH)
    version = created["metadata"]["resourceVersion"]
    ops = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": version},
        {"op": "add", "path": "/status", "value": {"kopf": {"progress": {}}}},
        {"op": "replace", "path": "/spec/replicas", "value": 9},
    ]

    _, patched = await emulator_api.patch(f"{SPEECHES}/s/status", ops, patch="json")
    stale_status, _ = await emulator_api.patch(f"{SPEECHES}/s/status", ops, patch="json")

    assert patched["status"] == {"kopf": {"progress": {}}}
    assert patched["spec"] == {"replicas": 1}
    assert stale_status == 422
