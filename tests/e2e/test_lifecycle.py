"""Create, roll out, update, delete: what a user sees through kubectl."""

from __future__ import annotations

import pytest

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import (
    EXAMPLES,
    HASH_LABEL,
    NAME,
    children,
    condition,
    create_and_settle,
    event_reasons,
    example_spec,
    mark_rolled_out,
    settled,
)


async def test_create_yields_owned_children_and_a_status(cluster: Cluster,
                                                         operator: Operator) -> None:
    speech = await create_and_settle(cluster)
    status = speech["status"]
    assert status["phase"] == "Progressing" and status["profile"] == "default"
    assert status["endpoint"] == f"http://{NAME}.{cluster.namespace}.svc:8091/v1"
    assert condition(speech, "Ready")["reason"] == "WaitingForWarmup"
    assert condition(speech, "Degraded")["status"] == "False"
    for kind, child in children(cluster).items():
        assert child is not None, kind
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner["uid"] == speech["metadata"]["uid"] and owner["controller"]
        assert child["metadata"]["labels"][HASH_LABEL] == status["configHash"]
    pod = children(cluster)["deployment"]["spec"]["template"]["spec"]  # type: ignore[index]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")
    await cluster.wait_for(lambda: {"Created", "ConfigChanged"} <= event_reasons(cluster),
                           message="creation events")


async def test_a_warmed_up_rollout_reads_ready(cluster: Cluster, operator: Operator) -> None:
    if not cluster.is_emulated:
        pytest.skip("on a real cluster, readiness waits for a real GPU pod's warm-up")
    await create_and_settle(cluster)
    await mark_rolled_out(cluster)
    speech = await cluster.wait_for(
        lambda: (s := cluster.api.get_speech(NAME)) and s["status"]["phase"] == "Ready" and s)
    assert condition(speech, "Ready")["reason"] == "WarmedUp"
    assert condition(speech, "Progressing")["status"] == "False"
    await cluster.wait_for(lambda: "PhaseReady" in event_reasons(cluster), message="Ready event")


async def test_profile_change_rolls_the_pod_with_a_new_hash(cluster: Cluster,
                                                            operator: Operator) -> None:
    before = await create_and_settle(cluster)
    old_hash = before["status"]["configHash"]
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "low-latency"}}})
    after = await cluster.wait_for(settled(cluster))
    new_hash = after["status"]["configHash"]
    assert new_hash != old_hash and after["status"]["profile"] == "low-latency"
    deployment = children(cluster)["deployment"]
    assert deployment is not None
    template = deployment["spec"]["template"]["metadata"]
    assert template["annotations"][HASH_LABEL] == new_hash
    configmap = children(cluster)["configmap"]
    assert configmap is not None and "micro_batch_size: 2" in configmap["data"][
        "deploy-config.yaml"]
    await cluster.wait_for(lambda: "ConfigChanged" in event_reasons(cluster))


async def test_scaling_out_keeps_one_gpu_per_pod_and_never_surges(cluster: Cluster,
                                                                  operator: Operator) -> None:
    await create_and_settle(cluster)
    cluster.api.patch_speech(NAME, {"spec": {"replicas": 3}})
    await cluster.wait_for(settled(cluster))
    deployment = await cluster.wait_for(
        lambda: (d := cluster.api.get("deployment", NAME)) and d["spec"]["replicas"] == 3 and d)
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0


async def test_deleting_the_resource_leaves_no_orphans(cluster: Cluster,
                                                       operator: Operator) -> None:
    await create_and_settle(cluster)
    cluster.api.delete_speech(NAME)
    await cluster.wait_for(lambda: not any(children(cluster).values()), timeout=60,
                           message="children garbage-collected")
    assert cluster.api.get_speech(NAME) is None


async def test_a_resource_deletes_without_the_operator(cluster: Cluster,
                                                       operator: Operator) -> None:
    """No finalizer holds a resource once the operator is uninstalled: it goes at once, and
    the API server's garbage collector takes its children by their owner references."""
    speech = await create_and_settle(cluster)
    assert not speech["metadata"].get("finalizers")
    await operator.stop()
    try:
        cluster.api.delete_speech(NAME)
        await cluster.wait_for(lambda: cluster.api.get_speech(NAME) is None, timeout=30,
                               message="the resource gone without the operator")
        if cluster.is_emulated:  # a real cluster's collector runs on its own schedule
            await cluster.wait_for(lambda: not any(children(cluster).values()), timeout=30,
                                   message="children garbage-collected")
    finally:
        await operator.start()


async def test_a_finalizer_an_older_version_left_is_removed(cluster: Cluster,
                                                            operator: Operator) -> None:
    await create_and_settle(cluster)
    cluster.api.patch_speech(NAME, {"metadata": {
        "finalizers": ["kopf.zalando.org/KopfFinalizerMarker"]}})
    await cluster.wait_for(
        lambda: not ((cluster.api.get_speech(NAME) or {}).get("metadata") or {}).get(
            "finalizers"), timeout=30, message="the old finalizer removed")


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
async def test_every_example_reconciles(cluster: Cluster, operator: Operator,
                                        example: str) -> None:
    spec = example_spec(example)
    token = spec["model"].get("huggingFace", {}).get("tokenSecretRef")
    if token:
        cluster.api.create("secret", {"metadata": {"name": token["name"]},
                                      "stringData": {token.get("key", "token"): "hf_x"}})
    speech = await create_and_settle(cluster, spec)
    assert speech["status"]["phase"] == "Progressing"
    assert condition(speech, "Degraded")["status"] == "False"
