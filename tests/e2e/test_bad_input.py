"""A refused spec changes nothing that runs, and says which field to fix."""

from __future__ import annotations

from typing import Any

import pytest
from minicpm_speech_emulator import Fault
from minicpm_speech_operator.errors import MESSAGE_LIMIT

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import (
    NAME,
    children,
    condition,
    create_and_settle,
    event_reasons,
    events,
    example_spec,
    settled,
    versions,
)

BAD_SPECS: dict[str, tuple[dict[str, Any], str]] = {
    "unknown profile": ({"profile": {"name": "turbo"}}, "spec.profile.name"),
    "mistyped override": (
        {"profileOverrides": {"stages": [{"stage_id": 0, "max_num_seq": 4}]}},
        "spec.profileOverrides.stages[stage_id=0].max_num_seq"),
    "override out of range": (
        {"profileOverrides": {"connectors": {"connector_of_shared_memory": {"extra": {
            "micro_batch_size": 0}}}}},
        "spec.profileOverrides.connectors.connector_of_shared_memory.extra.micro_batch_size"),
    # What only the pod used to refuse, at start-up, after the rollout had begun.
    "float16 on the batched engine": (
        {"profileOverrides": {"connectors": {"connector_of_shared_memory": {"extra": {
            "token2wav_float16": True}}}}},
        "spec.profileOverrides.connectors.connector_of_shared_memory.extra.token2wav_float16"),
    "chunk size the batched engine cannot decode": (
        {"profileOverrides": {"connectors": {"connector_of_shared_memory": {"extra": {
            "codec_chunk_frames": 50}}}}},
        "spec.profileOverrides.connectors.connector_of_shared_memory.extra.codec_chunk_frames"),
    "missing profile ConfigMap": ({"profile": {"configMapRef": {"name": "absent"}}},
                                  "spec.profile.configMapRef"),
    "missing token Secret": ({"model": {"huggingFace": {
        "repo": "openbmb/MiniCPM-o-4_5", "revision": "a" * 40,
        "tokenSecretRef": {"name": "absent"}}}}, "spec.model.huggingFace.tokenSecretRef"),
    "value out of range": ({"runtime": {"mps": {"activeThreadPercentage": 0}}},
                           "spec.runtime.mps.activeThreadPercentage"),
    # Cross-field rules: the CRD's CEL rules and patterns, and the operator's own checks.
    "port is the health port": ({"runtime": {"port": 9400}}, "spec.runtime.healthPort"),
    "image that is not one": ({"runtime": {"image": "not an image!"}}, "spec.runtime.image"),
    "no shared memory": ({"runtime": {"shmSizeLimit": "0"}}, "spec.runtime.shmSizeLimit"),
    "CPU limit below its request": (
        {"runtime": {"resources": {"requests": {"cpu": "8"}, "limits": {"cpu": "4"}}}},
        "spec.runtime.resources.limits.cpu"),
}
# A real API server refuses these manifests itself (schema, pattern or CEL rule).
REFUSED_BY_THE_API_SERVER = {"value out of range", "port is the health port",
                             "image that is not one", "no shared memory",
                             "CPU limit below its request"}
# Names the CRD's CEL rule refuses and no Service could carry.
BAD_NAMES = {"dots": "my.speech", "leading digit": "1speech", "64 characters": "s" * 64}
LONGEST_NAME = "s" * 63


def with_changes(changes: dict[str, Any]) -> dict[str, Any]:
    return {**example_spec(), **changes}


@pytest.mark.parametrize("case", sorted(BAD_SPECS))
async def test_bad_new_resource_creates_nothing(cluster: Cluster, operator: Operator,
                                                case: str) -> None:
    changes, field = BAD_SPECS[case]
    if not cluster.is_emulated and case in REFUSED_BY_THE_API_SERVER:
        pytest.skip("a real API server refuses this manifest itself")
    cluster.api.create_speech(NAME, with_changes(changes))
    speech = await cluster.wait_for(settled(cluster))
    degraded = condition(speech, "Degraded")
    assert speech["status"]["phase"] == "Degraded"
    assert degraded["reason"] == "InvalidSpec" and degraded["message"].startswith(field)
    assert not any(children(cluster).values())
    await cluster.wait_for(lambda: "InvalidSpec" in event_reasons(cluster))
    warning = next(e for e in events(cluster) if e["reason"] == "InvalidSpec")
    assert warning["type"] == "Warning" and field in warning["message"]


@pytest.mark.parametrize("case", sorted(BAD_NAMES))
async def test_a_name_no_child_can_carry_creates_nothing(cluster: Cluster, operator: Operator,
                                                         case: str) -> None:
    if not cluster.is_emulated:
        pytest.skip("a real API server refuses this name itself (the CRD's CEL rule)")
    name = BAD_NAMES[case]
    cluster.api.create_speech(name, example_spec())
    speech = await cluster.wait_for(settled(cluster, name))
    degraded = condition(speech, "Degraded")
    assert speech["status"]["phase"] == "Degraded"
    assert degraded["reason"] == "InvalidSpec"
    assert degraded["message"].startswith("metadata.name") and "at most 63" in degraded["message"]
    assert not any(children(cluster, name).values())
    assert not [o for o in cluster.api.list_objects("configmap")
                if o["metadata"]["name"].startswith(name)]


async def test_the_longest_name_serves(cluster: Cluster, operator: Operator) -> None:
    speech = await create_and_settle(cluster, name=LONGEST_NAME)
    assert condition(speech, "Degraded").get("status") != "True"
    assert all(children(cluster, LONGEST_NAME).values())


async def test_bad_update_leaves_the_serving_pod_and_config_exactly_as_they_were(
    cluster: Cluster, operator: Operator
) -> None:
    serving = await create_and_settle(cluster)
    before = versions(cluster)
    cluster.api.patch_speech(NAME, {"spec": {"profileOverrides": {
        "stages": [{"stage_id": 1, "max_num_seqs": "lots"}]}}})
    refused = await cluster.wait_for(settled(cluster))
    assert refused["status"]["phase"] == "Degraded"
    assert "stages[stage_id=1].max_num_seqs" in condition(refused, "Degraded")["message"]
    # It still serves the old configuration, and says so.
    assert refused["status"]["configHash"] == serving["status"]["configHash"]
    assert versions(cluster) == before


async def test_fixing_the_spec_recovers(cluster: Cluster, operator: Operator) -> None:
    cluster.api.create_speech(NAME, with_changes({"profile": {"name": "turbo"}}))
    await cluster.wait_for(settled(cluster))
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "default"}}})
    fixed = await cluster.wait_for(
        lambda: (s := settled(cluster)()) and s["status"]["phase"] != "Degraded" and s)
    assert condition(fixed, "Degraded")["status"] == "False"
    assert all(children(cluster).values())


async def test_a_profile_configmap_created_later_is_picked_up(cluster: Cluster,
                                                              operator: Operator) -> None:
    cluster.api.create_speech(NAME, with_changes({"profile": {"configMapRef": {"name": "mine"}}}))
    await cluster.wait_for(settled(cluster))
    profile = "stages:\n  - stage_id: 1\n    max_num_seqs: 4\n"
    cluster.api.create("configmap", {"metadata": {"name": "mine"},
                                     "data": {"profile.yaml": profile}})
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and s["status"].get("configHash") and s,
        timeout=30, message="resync picks up the ConfigMap")
    assert speech["status"]["profile"] == "configmap/mine"


async def test_an_unowned_object_in_the_way_is_not_touched(cluster: Cluster,
                                                           operator: Operator) -> None:
    foreign = cluster.api.create("configmap", {"metadata": {"name": f"{NAME}-deploy-config"},
                                               "data": {"mine": "yes"}})
    cluster.api.create_speech(NAME, example_spec())
    speech = await cluster.wait_for(settled(cluster))
    assert condition(speech, "Degraded")["reason"] == "ChildConflict"
    after = cluster.api.get("configmap", f"{NAME}-deploy-config")
    assert after is not None
    assert after["metadata"]["resourceVersion"] == foreign["metadata"]["resourceVersion"]



async def test_a_child_the_server_refuses_is_reported_and_none_is_created(
        cluster: Cluster, operator: Operator) -> None:
    """The backstop behind the operator's own checks: the API server (or an admission policy)
    refuses the Service, the last child written. The status carries the server's reason,
    capped, and the ConfigMap and Deployment before it are not left behind."""
    if not cluster.is_emulated:
        pytest.skip("the refusal is injected by the emulator")
    cluster.emulator.inject(Fault("POST", r"/namespaces/[^/]+/services$", status=422,
                                  times=10_000))
    cluster.api.create_speech(NAME, example_spec())
    speech = await cluster.wait_for(settled(cluster))
    degraded = condition(speech, "Degraded")
    assert speech["status"]["phase"] == "Degraded" and degraded["reason"] == "InvalidSpec"
    assert degraded["message"].startswith(f"Service {NAME}: refused by the API server (422)")
    assert "injected 422" in degraded["message"] and len(degraded["message"]) <= MESSAGE_LIMIT
    assert children(cluster) == {"configmap": None, "deployment": None, "service": None}


async def test_an_update_the_server_refuses_for_one_child_changes_none(
        cluster: Cluster, operator: Operator) -> None:
    """A new port changes the Deployment and the Service; the server refuses the Service's
    patch. The Deployment is not rolled to a port its Service would not route to."""
    if not cluster.is_emulated:
        pytest.skip("the refusal is injected by the emulator")
    await create_and_settle(cluster)
    before = versions(cluster)
    cluster.emulator.inject(Fault("PATCH", rf"/namespaces/[^/]+/services/{NAME}$", status=422,
                                  times=10_000))
    cluster.api.patch_speech(NAME, {"spec": {"runtime": {"port": 8100}}})
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and s["status"]["phase"] == "Degraded" and s,
        timeout=30, message="the refused update is reported")
    assert condition(speech, "Degraded")["message"].startswith(
        f"Service {NAME}: refused by the API server (422)")
    assert versions(cluster) == before
