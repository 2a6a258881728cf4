"""API faults, injected by the emulator on a fixed schedule: the operator rides through them,
and says what failed. (Injection needs the emulator: on a real cluster these are skipped.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import kubernetes.config
import pytest
from minicpm_speech_emulator import Fault

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import (
    NAME,
    children,
    create_and_settle,
    event_reasons,
    events,
    example_spec,
    settled,
)

LEASE = "minicpm-speech-operator"
LEASE_PATH = rf"/leases/{LEASE}$"


@pytest.fixture(autouse=True)
def emulated_only(cluster: Cluster) -> None:
    if not cluster.is_emulated:
        pytest.skip("faults are injected by the emulator")


async def test_one_500_on_a_childs_create_costs_seconds(
    cluster: Cluster, operator: Operator, caplog: pytest.LogCaptureFixture
) -> None:
    """Kopf's default retry after an unexpected error is a minute; a transient API error is
    retried within a second or two, and leaves a log line and a Warning event."""
    from prometheus_client import REGISTRY

    def retried() -> float:
        return REGISTRY.get_sample_value("minicpm_speech_operator_reconcile_retries_total",
                                         {"reason": "transient"}) or 0.0

    assert cluster.emulator is not None
    cluster.emulator.inject(Fault("POST", r"/namespaces/[^/]+/configmaps$", status=500))
    retried_before = retried()
    began = time.monotonic()
    cluster.api.create_speech(NAME, example_spec())
    await cluster.wait_for(settled(cluster), timeout=5.0, message="converged within 5 s")
    took = time.monotonic() - began
    assert [f[2] for f in cluster.emulator.faults_applied] == [500]
    assert all(children(cluster).values())
    assert retried() == retried_before + 1
    warnings = await cluster.wait_for(
        lambda: [e for e in events(cluster) if e.get("type") == "Warning"],
        message="a Warning event")
    assert [e["reason"] for e in warnings] == ["ApiUnavailable"], warnings
    assert "500" in warnings[0]["message"]
    logged = [r.getMessage() for r in caplog.records
              if r.name == "minicpm_speech_operator.handlers" and r.levelname == "WARNING"]
    assert any(f"{cluster.namespace}/{NAME}" in m and "API 500" in m for m in logged), logged
    print(f"converged {took:.1f} s after the create, through one injected 500")


async def test_fifty_resources_under_a_spell_of_faults_converge_once_it_ends(
    cluster: Cluster, operator: Operator
) -> None:
    """For 30 s, a tenth of the operator's writes fail (503 on create, 500 on patch) and a
    third of all reads wait 0.2 s (seeded, so the schedule repeats) while 50 resources are
    created; within 30 s of the faults stopping, every one has converged with exactly one of
    each child."""
    assert cluster.emulator is not None
    names = [f"speech-{i}" for i in range(50)]
    operator_writes = r"/namespaces/[^/]+/(configmaps|services|deployments|minicpmspeeches/)"
    cluster.emulator.inject(
        Fault("POST", operator_writes, status=503, times=10_000, probability=0.1),
        Fault("PATCH", operator_writes, status=500, times=10_000, probability=0.1),
        Fault("GET", r"/namespaces/", delay_s=0.2, times=10_000, probability=0.33),
        seed=23,
    )
    began = time.monotonic()
    for name in names:
        cluster.api.create_speech(name, example_spec())
    await asyncio.sleep(max(0.0, 30.0 - (time.monotonic() - began)))
    cluster.emulator.clear_faults()
    stopped = time.monotonic()
    failed = sum(1 for f in cluster.emulator.faults_applied if f[2] is not None)
    assert failed >= 10, failed

    def converged() -> bool:
        return all(settled(cluster, name)() and all(children(cluster, name).values())
                   for name in names)

    await cluster.wait_for(converged, timeout=30, interval=1.0, message="all 50 converged")
    print(f"converged {time.monotonic() - stopped:.1f} s after the faults stopped "
          f"({failed} failed requests injected)")
    for kind in ("configmap", "deployment", "service"):
        owned = [o for o in cluster.api.list_objects(kind)
                 if (o["metadata"].get("ownerReferences") or [{}])[0].get("name") in names]
        assert len(owned) == len(names), (kind, [o["metadata"]["name"] for o in owned])


# --------------------------------------------------------------------- leader election

def _process(cluster: Cluster, *extra: str) -> subprocess.Popen[str]:
    binary = os.path.join(os.path.dirname(sys.executable), "minicpm-speech")
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path), "POD_NAME": "operator-0",
           "POD_NAMESPACE": cluster.namespace}
    return subprocess.Popen(
        [binary, "operator", "--namespace", cluster.namespace, "--leader-elect",
         "--metrics-port", "0", "--health-port", "0", "--lease-duration", "6",
         "--lease-renew-deadline", "4", "--lease-retry-period", "1", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture
def leader(cluster: Cluster) -> Iterator[subprocess.Popen[str]]:
    process = _process(cluster)
    yield process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    print(process.communicate()[0])


def _leases(cluster: Cluster) -> Any:
    client = kubernetes.config.new_client_from_config(str(cluster.kubeconfig_path))
    return kubernetes.client.CoordinationV1Api(client)


def _lease(cluster: Cluster) -> dict[str, Any]:
    try:
        found = _leases(cluster).read_namespaced_lease(LEASE, cluster.namespace,
                                                       _preload_content=False)
    except kubernetes.client.exceptions.ApiException as error:
        if error.status == 404:
            return {}
        raise
    spec: dict[str, Any] = json.loads(found.data).get("spec") or {}
    return spec


async def test_the_leader_rides_through_a_failed_read_and_a_conflict(
    cluster: Cluster, leader: subprocess.Popen[str]
) -> None:
    """client-go's semantics: a failed renewal is retried until the renew deadline, so one
    500 on the Lease read and one 409 on its patch cost nothing; the leader keeps leading."""
    assert cluster.emulator is not None
    await cluster.wait_for(lambda: _lease(cluster).get("holderIdentity") == "operator-0",
                           timeout=30, message="leading")
    await create_and_settle(cluster)
    cluster.emulator.inject(Fault("GET", LEASE_PATH, status=500),
                            Fault("PATCH", LEASE_PATH, status=409))
    await cluster.wait_for(lambda: len(cluster.emulator.faults_applied) == 2,  # type: ignore[union-attr]
                           timeout=10, message="both faults were met")
    renewed = _lease(cluster)["renewTime"]
    await cluster.wait_for(lambda: _lease(cluster)["renewTime"] != renewed, timeout=5,
                           message="renewed after the faults")
    assert leader.poll() is None, "the leader exited"
    assert _lease(cluster)["holderIdentity"] == "operator-0"


async def test_a_leader_that_cannot_renew_stops_at_the_deadline(
    cluster: Cluster, leader: subprocess.Popen[str]
) -> None:
    """Renewals failing past the renew deadline (4 s here): the leader stops leading, before
    its 6 s lease runs out, and exits non-zero so Kubernetes restarts it as a standby."""
    assert cluster.emulator is not None
    await cluster.wait_for(lambda: _lease(cluster).get("holderIdentity") == "operator-0",
                           timeout=30, message="leading")
    cluster.emulator.inject(Fault("GET", LEASE_PATH, status=503, times=1000))
    began = time.monotonic()
    assert leader.wait(timeout=15) == 1
    assert time.monotonic() - began < 6.0


async def test_a_resumed_leader_writes_nothing_once_its_lease_is_stale(
    cluster: Cluster, leader: subprocess.Popen[str]
) -> None:
    """A leader stopped past its renew deadline (SIGSTOP, a frozen node) resumes with a stale
    lease: it does not write until it has renewed, and its renewal finds another holder, so it
    exits having written nothing."""
    assert cluster.emulator is not None
    await cluster.wait_for(lambda: _lease(cluster).get("holderIdentity") == "operator-0",
                           timeout=30, message="leading")
    await create_and_settle(cluster)
    # what it did while it led is reported (its events are posted) before the pause
    await cluster.wait_for(lambda: "PhaseProgressing" in event_reasons(cluster), timeout=10)
    await asyncio.sleep(1.0)
    leader.send_signal(signal.SIGSTOP)
    try:
        # a standby's takeover, once the lease expired
        time.sleep(7)
        _leases(cluster).patch_namespaced_lease(LEASE, cluster.namespace, {"spec": {
            "holderIdentity": "operator-1",
            "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}},
            _content_type="application/merge-patch+json")
        # work for the paused leader: its watch delivers this as soon as it resumes
        cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "low-latency"}}})
        seen = len(cluster.request_log())
        # its renewal is slow to answer, so the change reaches its handlers first
        cluster.emulator.inject(Fault("GET", LEASE_PATH, delay_s=3.0, times=3))
    finally:
        leader.send_signal(signal.SIGCONT)
    assert leader.wait(timeout=15) == 1
    writes = [r for r in cluster.request_log()[seen:]
              if r.verb in ("create", "patch", "update", "delete") and r.resource != "leases"]
    assert writes == [], writes
    assert (cluster.api.get_speech(NAME) or {})["status"]["observedGeneration"] == 1


async def test_hung_reads_stall_neither_the_other_resources_nor_the_lease(
    cluster: Cluster, leader: subprocess.Popen[str]
) -> None:
    """Six reads, one for each of six resources, held for 20 s by a slow API server (as many
    as the event loop's default executor has threads on two cores): the operator's calls run
    on a pool of their own and the Lease on its own thread, so other resources converge and
    the lease is renewed on time meanwhile."""
    assert cluster.emulator is not None
    await cluster.wait_for(lambda: _lease(cluster).get("holderIdentity") == "operator-0",
                           timeout=30, message="leading")
    cluster.emulator.inject(Fault("GET", r"/minicpmspeeches/slow-\d$", delay_s=20.0, times=6))
    for i in range(6):
        cluster.api.create_speech(f"slow-{i}", example_spec())
    await cluster.wait_for(lambda: len(cluster.emulator.faults_applied) == 6,  # type: ignore[union-attr]
                           timeout=10, message="six reads hang")
    began, renewals = time.monotonic(), {_lease(cluster)["renewTime"]}
    others = [f"fast-{i}" for i in range(4)]
    for name in others:
        cluster.api.create_speech(name, example_spec())
    for name in others:
        await cluster.wait_for(settled(cluster, name), timeout=10)
    while time.monotonic() - began < 8:
        renewals.add(_lease(cluster)["renewTime"])
        await asyncio.sleep(0.5)
    assert len(renewals) >= 4, renewals  # every second, as the retry period says
    assert leader.poll() is None and _lease(cluster)["holderIdentity"] == "operator-0"
