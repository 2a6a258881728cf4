"""Idempotence, drift repair and restarts: the operator converges, never duplicates."""

from __future__ import annotations

import asyncio
from typing import Any

from minicpm_speech_operator.manifests import GROUP

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .conftest import RESYNC_SECONDS
from .journey import HASH_LABEL, NAME, children, create_and_settle, settled, versions

CHILD_RESOURCES = {"configmaps", "deployments", "services"}


def _writes(cluster: Cluster, since: int = 0) -> list[Any]:
    return [r for r in cluster.request_log()[since:]
            if r.verb in ("create", "patch", "update", "delete")
            and r.resource in CHILD_RESOURCES | {"minicpmspeeches"}]


def _handled(cluster: Cluster) -> bool:
    """Kopf has stored the handled spec and holds no handler progress: the first reconcile,
    its own closing patches included, is over."""
    notes = ((cluster.api.get_speech(NAME) or {}).get("metadata") or {}).get("annotations") or {}
    kopf_own = {f"{GROUP}/last-handled-configuration", f"{GROUP}/kopf-managed"}
    progress = [k for k in notes if k.startswith(f"{GROUP}/") and k not in kopf_own]
    return f"{GROUP}/last-handled-configuration" in notes and not progress


async def test_reconciling_again_changes_nothing(cluster: Cluster, operator: Operator) -> None:
    await create_and_settle(cluster)
    await cluster.wait_for(lambda: _handled(cluster), message="the first reconcile is over")
    before, seen = versions(cluster), len(cluster.request_log())
    # Several periodic resyncs run the whole reconcile again.
    await asyncio.sleep(float(RESYNC_SECONDS) * 2.5)
    assert versions(cluster) == before
    assert _writes(cluster, seen) == [] or not cluster.is_emulated


async def test_a_deleted_child_is_restored(cluster: Cluster, operator: Operator) -> None:
    speech = await create_and_settle(cluster)
    cluster.api.delete("configmap", f"{NAME}-deploy-config")
    restored = await cluster.wait_for(lambda: cluster.api.get("configmap", f"{NAME}-deploy-config"))
    assert restored["metadata"]["labels"][HASH_LABEL] == speech["status"]["configHash"]


async def test_a_hand_edited_child_is_restored(cluster: Cluster, operator: Operator) -> None:
    await create_and_settle(cluster)
    deployment = cluster.api.get("deployment", NAME)
    assert deployment is not None
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    cluster.api.patch("deployment", NAME, {"spec": {"replicas": 5}})
    cluster.api.patch("configmap", f"{NAME}-deploy-config",
                      {"data": {"deploy-config.yaml": "stages: []\n", "stray.yaml": "x"}})

    def repaired() -> bool:
        d, c = cluster.api.get("deployment", NAME), children(cluster)["configmap"]
        return bool(d and c and d["spec"]["replicas"] == 1
                    and d["spec"]["template"]["spec"]["containers"][0]["image"] == image
                    and "stray.yaml" not in c["data"]
                    and "base_config" in c["data"]["deploy-config.yaml"])

    await cluster.wait_for(repaired, message="deployment and config restored")


async def test_restart_mid_way_converges_without_duplicates(cluster: Cluster,
                                                            operator: Operator) -> None:
    await create_and_settle(cluster)
    await operator.stop()
    # While the operator is away: the spec changes and a child disappears.
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "high-concurrency"}}})
    cluster.api.delete("service", NAME)
    await operator.start()
    speech = await cluster.wait_for(settled(cluster), timeout=30)
    assert speech["status"]["profile"] == "high-concurrency"
    await cluster.wait_for(lambda: cluster.api.get("service", NAME), message="service back")
    for kind in ("configmap", "deployment", "service"):
        managed = cluster.api.list_objects(
            kind, label_selector="app.kubernetes.io/managed-by=minicpm-speech-operator")
        assert len(managed) == 1, kind
        assert managed[0]["metadata"]["labels"][HASH_LABEL] == speech["status"]["configHash"]
