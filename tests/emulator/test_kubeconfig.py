"""The kubeconfig is read when connecting, so each fresh emulator (a new port) is reachable."""

from __future__ import annotations

from pathlib import Path

import kubernetes.client
import pytest
from minicpm_speech_emulator import running_emulator
from minicpm_speech_operator.kubeconfig import api_client, connection_from_environment

from tests.harness.cluster import Cluster

pytestmark = pytest.mark.emulator_only


async def test_each_emulator_is_found_through_kubeconfig_at_call_time(
    crd_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers = []
    # both alive at once, so the two cannot share a port
    async with running_emulator(crd_path, ["ns1"]) as a, running_emulator(crd_path, ["ns1"]) as b:
        for running in (a, b):
            monkeypatch.setenv("KUBECONFIG", str(running.kubeconfig_path))
            servers.append(connection_from_environment().server)
            assert servers[-1] == running.url

    assert servers[0] != servers[1]


async def test_kubeconfig_wins_over_the_in_cluster_account(
    crd_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    async with running_emulator(crd_path) as running:
        monkeypatch.setenv("KUBECONFIG", str(running.kubeconfig_path))
        info = connection_from_environment()

    assert info.server == running.url
    assert (info.scheme, info.token) == ("Bearer", "emulator")


def test_the_official_client_works_from_the_written_kubeconfig(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig_path))
    with api_client() as client:
        namespaces = kubernetes.client.CoreV1Api(client).list_namespace()

    assert "default" in [ns.metadata.name for ns in namespaces.items if ns.metadata]
