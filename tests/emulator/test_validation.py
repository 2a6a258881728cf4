"""The emulator refuses what a real API server refuses: names, labels and sizes outside
Kubernetes' rules, answered with the same Status a real server sends."""

from __future__ import annotations

from typing import Any

import pytest
from minicpm_speech_contract.bounded import API_SERVER_MAX_JSON_DEPTH
from minicpm_speech_emulator.emulator import MAX_OBJECT_BYTES

from tests.harness.http import EmulatorHttp

pytestmark = pytest.mark.emulator_only

NS = "/api/v1/namespaces/ns1"
SPEECHES = "/apis/serving.minicpm-speech.io/v1alpha1/namespaces/ns1/minicpmspeeches"
DEPLOYMENTS = "/apis/apps/v1/namespaces/ns1/deployments"


def service(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"ports": [{"port": 80}], "selector": {"app": "x"}}}


def assert_invalid(status: int, body: dict[str, Any], kind: str, name: str, field: str) -> None:
    assert status == 422
    assert body["kind"] == "Status" and body["status"] == "Failure" and body["code"] == 422
    assert body["reason"] == "Invalid"
    assert body["message"].startswith(f'{kind} "{name}" is invalid: {field}: Invalid value')
    assert body["details"]["name"] == name and body["details"]["kind"] == kind
    assert {cause["field"] for cause in body["details"]["causes"]} == {field}


@pytest.mark.parametrize("name", ["my.speech", "1speech", "a" * 64, "Speech", "speech-"])
async def test_a_service_name_must_be_a_dns1035_label(emulator_api: EmulatorHttp,
                                                      name: str) -> None:
    status, body = await emulator_api.post(f"{NS}/services", service(name))
    assert_invalid(status, body, "Service", name, "metadata.name")
    assert (await emulator_api.get(f"{NS}/services/x"))[0] == 404


async def test_the_longest_service_name_is_accepted(emulator_api: EmulatorHttp) -> None:
    status, _ = await emulator_api.post(f"{NS}/services", service("a" * 63))
    assert status == 201


@pytest.mark.parametrize(("name", "ok"), [
    ("my.config", True), ("1config", True), ("a" * 253, True),
    ("a" * 254, False), ("My-Config", False), ("a..b", False), ("-a", False),
])
async def test_other_names_must_be_dns1123_subdomains(emulator_api: EmulatorHttp, name: str,
                                                     ok: bool) -> None:
    status, body = await emulator_api.post(f"{NS}/configmaps", {"metadata": {"name": name}})
    if ok:
        assert status == 201
    else:
        assert_invalid(status, body, "ConfigMap", name, "metadata.name")


async def test_a_custom_resource_name_is_a_subdomain_too(emulator_api: EmulatorHttp) -> None:
    body = {"apiVersion": "serving.minicpm-speech.io/v1alpha1", "kind": "MiniCPMSpeech",
            "metadata": {"name": "my.speech"}, "spec": {}}
    assert (await emulator_api.post(SPEECHES, body))[0] == 201
    status, refused = await emulator_api.post(SPEECHES, {**body, "metadata": {"name": "A"}})
    assert_invalid(status, refused, "MiniCPMSpeech", "A", "metadata.name")


@pytest.mark.parametrize(("key", "value"), [
    ("app", "a" * 64), ("app", "-a"), ("app", "a b"), ("Bad_Prefix/app", "a"), ("a" * 64, "a"),
])
async def test_label_keys_and_values_follow_the_rules(emulator_api: EmulatorHttp, key: str,
                                                      value: str) -> None:
    status, body = await emulator_api.post(
        f"{NS}/configmaps", {"metadata": {"name": "c", "labels": {key: value}}})
    assert_invalid(status, body, "ConfigMap", "c", "metadata.labels")


async def test_pod_template_labels_are_checked(emulator_api: EmulatorHttp) -> None:
    labels = {"app": "x" * 64}
    deployment = {"metadata": {"name": "d"}, "spec": {
        "selector": {"matchLabels": {"app": "ok"}},
        "template": {"metadata": {"labels": labels}, "spec": {"containers": []}}}}
    status, body = await emulator_api.post(DEPLOYMENTS, deployment)
    assert_invalid(status, body, "Deployment", "d", "spec.template.metadata.labels")


async def test_a_patch_cannot_add_a_bad_label(emulator_api: EmulatorHttp) -> None:
    await emulator_api.post(f"{NS}/configmaps", {"metadata": {"name": "c"}})
    status, body = await emulator_api.patch(f"{NS}/configmaps/c",
                                            {"metadata": {"labels": {"app": "-x"}}})
    assert_invalid(status, body, "ConfigMap", "c", "metadata.labels")
    _, live = await emulator_api.get(f"{NS}/configmaps/c")
    assert not live["metadata"].get("labels")


async def test_a_body_over_the_object_limit_is_too_large(emulator_api: EmulatorHttp) -> None:
    big = {"metadata": {"name": "big"}, "data": {"k": "x" * MAX_OBJECT_BYTES}}
    status, body = await emulator_api.post(f"{NS}/configmaps", big)
    assert status == 413
    assert body["kind"] == "Status" and body["reason"] == "RequestEntityTooLarge"
    assert (await emulator_api.get(f"{NS}/configmaps/big"))[0] == 404
    fits = {"metadata": {"name": "fits"}, "data": {"k": "x" * (MAX_OBJECT_BYTES - 1024)}}
    assert (await emulator_api.post(f"{NS}/configmaps", fits))[0] == 201
    status, _ = await emulator_api.patch(f"{NS}/configmaps/fits", big)
    assert status == 413


DRY = {"dryRun": "All"}


async def test_a_dry_run_create_is_validated_and_answered_but_not_stored(
        emulator_api: EmulatorHttp) -> None:
    status, body = await emulator_api.request("POST", f"{NS}/services", service("web"),
                                              params=DRY)
    assert status == 201 and body["metadata"]["name"] == "web"
    assert (await emulator_api.get(f"{NS}/services/web"))[0] == 404
    status, body = await emulator_api.request("POST", f"{NS}/services", service("my.web"),
                                              params=DRY)
    assert_invalid(status, body, "Service", "my.web", "metadata.name")


async def test_a_dry_run_patch_or_delete_changes_nothing(emulator_api: EmulatorHttp) -> None:
    _, stored = await emulator_api.post(f"{NS}/configmaps", {"metadata": {"name": "c"},
                                                             "data": {"k": "old"}})
    status, answered = await emulator_api.request(
        "PATCH", f"{NS}/configmaps/c", {"data": {"k": "new"}}, params=DRY)
    assert status == 200 and answered["data"] == {"k": "new"}
    status, _ = await emulator_api.request("DELETE", f"{NS}/configmaps/c", params=DRY)
    assert status == 200
    status, live = await emulator_api.get(f"{NS}/configmaps/c")
    assert status == 200 and live == stored


async def test_a_dry_run_other_than_all_is_a_bad_request(emulator_api: EmulatorHttp) -> None:
    status, body = await emulator_api.request("POST", f"{NS}/configmaps",
                                              {"metadata": {"name": "c"}},
                                              params={"dryRun": "Some"})
    assert status == 400 and "dryRun must be All" in body["message"]
    assert (await emulator_api.get(f"{NS}/configmaps/c"))[0] == 404


async def test_annotations_over_256_kib_are_refused(emulator_api: EmulatorHttp) -> None:
    _, stored = await emulator_api.post(f"{NS}/configmaps", {"metadata": {"name": "c"}})
    status, body = await emulator_api.patch(
        f"{NS}/configmaps/c", {"metadata": {"annotations": {"a": "x" * (256 * 1024)}}})
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"] == ('ConfigMap "c" is invalid: metadata.annotations: Too long: '
                               'must have at most 262144 bytes')
    assert body["details"]["causes"][0]["reason"] == "FieldValueTooLong"
    assert (await emulator_api.get(f"{NS}/configmaps/c"))[1] == stored
    status, _ = await emulator_api.patch(
        f"{NS}/configmaps/c", {"metadata": {"annotations": {"a": "x" * (256 * 1024 - 1)}}})
    assert status == 200


async def test_json_is_decoded_to_the_api_servers_depth_and_refused_past_it(
        emulator_api: EmulatorHttp) -> None:
    def nested(depth: int) -> str:
        return '{"metadata": {"name": "deep"}, "data": {"k": "v"}, "x": ' + \
            '{"a":' * depth + "{}" + "}" * depth + "}"

    async def post(text: str) -> tuple[int, Any]:
        async with emulator_api.session.post(f"{NS}/configmaps", data=text, headers={
                "Content-Type": "application/json"}) as response:
            return response.status, await response.json(content_type=None)

    status, body = await post(nested(API_SERVER_MAX_JSON_DEPTH + 1))
    assert status == 400 and body["reason"] == "BadRequest"
    assert f"deeper than {API_SERVER_MAX_JSON_DEPTH} levels" in body["message"]
    status, _ = await post(nested(API_SERVER_MAX_JSON_DEPTH - 2))
    assert status == 201
