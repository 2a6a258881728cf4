"""The server fills in identity and versioning metadata, as a real API server does."""

from __future__ import annotations

import pytest

from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

CONFIGMAPS = "/api/v1/namespaces/ns1/configmaps"
SPEECHES = "/apis/serving.minicpm-speech.io/v1alpha1/namespaces/ns1/minicpmspeeches"


def speech(name: str, **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "serving.minicpm-speech.io/v1alpha1",
        "kind": "MiniCPMSpeech",
        "metadata": {"name": name},
        "spec": spec,
    }


async def test_create_fills_in_uid_versions_timestamp_and_namespace(
    emulator_api: EmulatorHttp,
) -> None:
    status, created = await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "a"}, "data": {}})

    assert status == 201
    meta = created["metadata"]
    assert meta["namespace"] == "ns1"  # from the URL; the body had none
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"].endswith("Z")
    assert meta["generation"] == 1
    _, fetched = await emulator_api.get(f"{CONFIGMAPS}/a")
    assert fetched == created


async def test_generate_name_gives_every_object_its_own_name(emulator_api: EmulatorHttp) -> None:
    body = {"metadata": {"generateName": "kopf-event-"}, "message": "hello"}
    replies = [await emulator_api.post("/api/v1/namespaces/ns1/events", body) for _ in range(2)]

    names = [reply["metadata"]["name"] for status, reply in replies if status == 201]
    assert len(set(names)) == 2
    assert all(name.startswith("kopf-event-") for name in names)


async def test_creating_an_existing_name_conflicts(emulator_api: EmulatorHttp) -> None:
    await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "a"}})
    status, reply = await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "a"}})

    assert status == 409
    assert reply["kind"] == "Status" and reply["reason"] == "AlreadyExists"


async def test_generation_counts_spec_changes_only(emulator_api: EmulatorHttp) -> None:
    _, created = await emulator_api.post(SPEECHES, speech("s", replicas=1))
    _, relabelled = await emulator_api.patch(f"{SPEECHES}/s", {"metadata": {"labels": {"a": "b"}}})
    _, respecced = await emulator_api.patch(f"{SPEECHES}/s", {"spec": {"replicas": 2}})
    _, restatused = await emulator_api.patch(f"{SPEECHES}/s/status", {"status": {"phase": "Ready"}})

    generations = [
        b["metadata"]["generation"] for b in (created, relabelled, respecced, restatused)
    ]
    assert generations == [1, 1, 2, 2]
    versions = [
        int(b["metadata"]["resourceVersion"]) for b in (created, relabelled, respecced, restatused)
    ]
    assert versions == sorted(set(versions))  # every write is a new, higher resourceVersion


async def test_a_write_that_changes_nothing_keeps_the_resource_version(
    emulator_api: EmulatorHttp,
) -> None:
    _, created = await emulator_api.post(SPEECHES, speech("s", replicas=1))
    _, same = await emulator_api.patch(f"{SPEECHES}/s", {"spec": {"replicas": 1}})

    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_server_owned_metadata_cannot_be_patched(emulator_api: EmulatorHttp) -> None:
    _, created = await emulator_api.post(CONFIGMAPS, {"metadata": {"name": "a"}})
    patch = {
        "metadata": {"uid": "forged", "creationTimestamp": "1999-01-01T00:00:00Z"},
        "data": {"k": "v"},
    }
    _, patched = await emulator_api.patch(f"{CONFIGMAPS}/a", patch)

    assert patched["metadata"]["uid"] == created["metadata"]["uid"]
    assert patched["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]
    assert patched["data"] == {"k": "v"}
