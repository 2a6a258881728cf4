"""The operator as the Helm chart runs it: the real command, its RBAC, health and metrics.

The chart's rendered container arguments start `minicpm-speech operator` against the
cluster; a user's whole journey runs through it; then every API request it made must be
allowed by the rendered Role/ClusterRole, and every rule the chart grants must have been
needed by some request.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from minicpm_speech_contract.bounded import API_SERVER_MAX_JSON_DEPTH
from prometheus_client.parser import text_string_to_metric_families

from tests.chart.rbac import is_allowed, rendered_grants, rendered_rules
from tests.chart.rendering import operator_container, render_objects
from tests.harness.cluster import Cluster

from .journey import NAME, children, create_and_settle, example_spec, mark_rolled_out, settled
from .perf_journey import finish, job_of, jobs, perf_spec, perf_status, sweep_result

API_VERSION = "serving.minicpm-speech.io/v1alpha1"
MODES = {"namespaced": {}, "cluster-wide": {"watch": {"clusterWide": True}}}
OPERATOR_METRICS = {
    "minicpm_speech_operator_reconciles": "counter",
    "minicpm_speech_operator_reconcile_failures": "counter",
    "minicpm_speech_operator_reconcile_duration_seconds": "histogram",
    "minicpm_speech_operator_child_changes": "counter",
    "minicpm_speech_operator_reconcile_retries": "counter",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def chart_command(values: dict[str, Any], namespace: str, ports: dict[str, int]) -> list[str]:
    """The operator container's arguments as the chart renders them for this namespace."""
    container = operator_container(render_objects(values, namespace))
    args = []
    for arg in container["args"]:
        flag = arg.split("=", 1)[0]
        args.append(f"{flag}={ports[flag]}" if flag in ports else arg)
    return [*container.get("command", ["minicpm-speech"]), *args]


@pytest.fixture
def operator_process(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[Any]:
    if not cluster.is_emulated:
        pytest.skip("the RBAC proof reads the emulator's request log")
    values = MODES[request.param]
    ports = {"--metrics-port": free_port(), "--health-port": free_port()}
    command = chart_command(values, cluster.namespace, ports)
    binary = os.path.join(os.path.dirname(sys.executable), command[0])
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig_path), "POD_NAME": "operator-0",
           "POD_NAMESPACE": cluster.namespace, "MINICPM_SPEECH_RESYNC_SECONDS": "2"}
    process = subprocess.Popen([binary, *command[1:]], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    process.values, process.ports = values, ports  # type: ignore[attr-defined]
    yield process
    if process.poll() is None:
        process.kill()
    print(process.communicate()[0])


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status, response.read().decode()


async def run_journey(cluster: Cluster) -> None:
    """Every kind of work the operator does, so every request it can make is made."""
    cluster.api.create("secret", {"metadata": {"name": "hf"}, "stringData": {"token": "t"}})
    spec = example_spec()
    spec["model"]["huggingFace"]["tokenSecretRef"] = {"name": "hf"}
    await create_and_settle(cluster, spec)
    await mark_rolled_out(cluster)
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "low-latency"}}})
    await cluster.wait_for(settled(cluster))
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "no-such-profile"}}})
    await cluster.wait_for(settled(cluster))
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "default"}}})
    await cluster.wait_for(settled(cluster))
    cluster.api.patch("service", NAME, {"spec": {"ports": []}})
    cluster.api.patch("deployment", NAME, {"spec": {"replicas": 4}})
    cluster.api.delete("configmap", f"{NAME}-deploy-config")
    await cluster.wait_for(lambda: all(children(cluster).values())
                           and children(cluster)["deployment"]["spec"]["replicas"] == 1
                           and children(cluster)["service"]["spec"]["ports"],
                           message="drift repaired")
    await run_benchmarks(cluster)
    await run_autoscaling(cluster)
    cluster.api.delete_speech(NAME)
    await cluster.wait_for(lambda: not any(children(cluster).values()), timeout=30)


async def run_autoscaling(cluster: Cluster) -> None:
    """An autoscaler created, retargeted, then deleted when autoscaling is turned off."""
    cluster.api.patch_speech(NAME, {"spec": {"autoscaling": {
        "enabled": True, "maxReplicas": 3, "target": 8}}})
    await cluster.wait_for(lambda: cluster.api.get("horizontalpodautoscaler", NAME), timeout=30)
    cluster.api.patch_speech(NAME, {"spec": {"autoscaling": {"maxReplicas": 4}}})
    await cluster.wait_for(lambda: (cluster.api.get("horizontalpodautoscaler", NAME) or {}).get(
        "spec", {}).get("maxReplicas") == 4, timeout=30, message="the HPA patched")
    cluster.api.patch_speech(NAME, {"spec": {"autoscaling": {"enabled": False}}})
    await cluster.wait_for(lambda: cluster.api.get("horizontalpodautoscaler", NAME) is None,
                           timeout=30, message="the HPA deleted")


async def run_benchmarks(cluster: Cluster) -> None:
    """Jobs for a hash, a finished one read from its pod, running ones superseded."""
    cluster.api.patch_speech(NAME, {"spec": {"perf": perf_spec(historyLimit=1)["perf"]}})
    config_hash = (await cluster.wait_for(settled(cluster)))["status"]["configHash"]
    sweep = await cluster.wait_for(lambda: job_of(cluster, "sweep", config_hash), timeout=30)
    finish(cluster, sweep, sweep_result(config_hash, {1: 8.0, 8: 24.0}))
    await cluster.wait_for(lambda: perf_status(cluster).get("sweep", {}).get("state")
                           == "Succeeded", timeout=30, message="the sweep result is read")
    cluster.api.patch_speech(NAME, {"spec": {"profile": {"name": "high-concurrency"}}})
    await cluster.wait_for(lambda: jobs(cluster, config_hash) == [], timeout=30,
                           message="superseded and pruned")


@pytest.mark.parametrize("operator_process", sorted(MODES), indirect=True)
async def test_chart_command_runs_the_journey_within_its_rbac(cluster: Cluster,
                                                              operator_process: Any) -> None:
    health = f"http://127.0.0.1:{operator_process.ports['--health-port']}/healthz"
    await cluster.wait_for(lambda: _answers(health), timeout=30, message="healthz answers")
    await run_journey(cluster)

    status, body = get(f"http://127.0.0.1:{operator_process.ports['--metrics-port']}/metrics")
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(body)}
    for name, kind in OPERATOR_METRICS.items():
        assert families[name].type == kind, name
    reconciles = {s.labels.get("result"): s.value for s in families[
        "minicpm_speech_operator_reconciles"].samples if s.name.endswith("_total")}
    assert reconciles["ok"] > 0 and reconciles["invalid"] > 0

    operator_process.send_signal(signal.SIGTERM)
    assert operator_process.wait(timeout=30) == 0

    requests = cluster.request_log()
    values = operator_process.values
    denied = sorted({(r.verb, r.group, r.resource, r.subresource, r.namespace, r.name)
                     for r in requests
                     if not is_allowed(rendered_rules(values, namespace=r.namespace,
                                                      release_namespace=cluster.namespace),
                                       r.verb, r.group, r.resource, r.subresource, r.name)},
                    key=str)
    assert denied == [], f"requests the chart does not allow: {denied}"

    used = {(r.verb, r.group, r.resource, r.subresource) for r in requests}
    unused = sorted(
        (verb, group, resource)
        for grant in rendered_grants(values, cluster.namespace)
        for group in grant.rule["apiGroups"]
        for resource in grant.rule["resources"]
        for verb in grant.rule["verbs"]
        if (verb, group, *_split(resource)) not in used
    )
    assert unused == [], f"rules the operator never needed: {unused}"
    lease = [r for r in requests if r.resource == "leases"]
    assert {r.verb for r in lease} >= {"create", "get", "patch"}


@pytest.mark.parametrize("operator_process", ["namespaced"], indirect=True)
async def test_a_resource_nested_as_deep_as_the_server_stores_is_refused_in_status(
        cluster: Cluster, operator_process: Any) -> None:
    """The API server decodes and stores JSON nested up to 10,000 levels, deeper than the
    Python json module and copy.deepcopy go by default: a real operator process watching such
    a resource keeps watching, refuses it in status and serves the others."""
    depth = API_SERVER_MAX_JSON_DEPTH - 100
    overrides = '{"a":' * depth + "{}" + "}" * depth
    spec = json.dumps({**example_spec(), "profileOverrides": None}).replace(
        '"profileOverrides": null', f'"profileOverrides": {overrides}')
    body = (f'{{"apiVersion": "{API_VERSION}", "kind": "MiniCPMSpeech", '
            f'"metadata": {{"name": "deep"}}, "spec": {spec}}}')
    server = yaml.safe_load(cluster.kubeconfig_path.read_text())["clusters"][0]["cluster"]
    request = urllib.request.Request(
        f"{server['server']}/apis/{API_VERSION}/namespaces/{cluster.namespace}/minicpmspeeches",
        data=body.encode(), headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
    cluster.api.create_speech(NAME, example_spec())
    await cluster.wait_for(lambda: all(children(cluster).values()), timeout=30,
                           message="the other resource is served")

    def degraded() -> Any:
        speech = cluster.api.get_speech("deep") or {}
        return next((c for c in (speech.get("status") or {}).get("conditions") or []
                     if c["type"] == "Degraded" and c["status"] == "True"), None)

    condition = await cluster.wait_for(degraded, timeout=30, message="deep is refused")
    assert condition["reason"] == "InvalidSpec"
    assert condition["message"].startswith("spec.profileOverrides: nests deeper than the limit")
    assert operator_process.poll() is None


def _split(resource: str) -> tuple[str, str | None]:
    plural, _, sub = resource.partition("/")
    return plural, sub or None


def _answers(url: str) -> bool:
    try:
        return get(url)[0] == 200
    except OSError:
        return False
