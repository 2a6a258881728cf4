"""Hostile input through the real operator: a profile ConfigMap that would expand or nest
without bound, or overrides nested past any real need, end in an InvalidSpec status within 10 s
and without the operator's memory growing by 100 MB; nothing is created."""

from __future__ import annotations

import json
import resource
import time
import urllib.request
from typing import Any

import pytest
import yaml
from minicpm_speech_operator.manifests import GROUP

from tests.harness.cluster import Cluster
from tests.harness.kopf_runner import Operator

from .journey import NAME, children, condition, example_spec, settled

FIELD = "spec.profile.configMapRef"
PAYLOAD = "lol" * 3


def alias_bomb() -> str:
    lines = [f"a: &a [{', '.join([PAYLOAD] * 9)}]"]
    for level in range(1, 10):
        name, below = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{below}'] * 9)}]")
    # A type error for the expanded tree: what used to build a message quoting all of it.
    return "\n".join(lines) + "\nstages: *j\n"


def deep_profile(depth: int = 500) -> str:
    return "stages:\n  - stage_id: 0\n    max_num_seqs: " + "[" * depth + "1" + "]" * depth + "\n"


def peak_rss_mb() -> float:
    # The operator runs in this process (Kopf's runner, in a thread): its peak is ours.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def refused_quickly(cluster: Cluster, spec: dict[str, Any] | str) -> dict[str, Any]:
    before = peak_rss_mb()
    started = time.monotonic()
    if isinstance(spec, str):
        create_raw(cluster, spec)
    else:
        cluster.api.create_speech(NAME, spec)
    speech: dict[str, Any] = await cluster.wait_for(settled(cluster), timeout=10)
    assert time.monotonic() - started <= 10
    assert peak_rss_mb() - before < 100, "the operator's memory grew by 100 MB or more"
    assert speech["status"]["phase"] == "Degraded"
    assert condition(speech, "Degraded")["reason"] == "InvalidSpec"
    assert not any(children(cluster).values())
    return speech


async def profile_configmap_refused(cluster: Cluster, text: str) -> str:
    cluster.api.create("configmap", {"metadata": {"name": "hostile"},
                                     "data": {"profile.yaml": text}})
    spec = {**example_spec(), "profile": {"configMapRef": {"name": "hostile"}}}
    speech = await refused_quickly(cluster, spec)
    message: str = condition(speech, "Degraded")["message"]
    assert message.startswith(FIELD) and PAYLOAD not in message and len(message) <= 1024
    return message


async def test_a_configmap_alias_bomb_is_refused_before_it_expands(
        cluster: Cluster, operator: Operator) -> None:
    message = await profile_configmap_refused(cluster, alias_bomb())
    assert "max_aliases" in message


async def test_a_500_deep_configmap_profile_is_refused(cluster: Cluster,
                                                       operator: Operator) -> None:
    message = await profile_configmap_refused(cluster, deep_profile())
    assert "max_depth" in message


def create_raw(cluster: Cluster, spec_json: str) -> None:
    """POST a MiniCPMSpeech written as JSON text: the Kubernetes client serialises a body
    recursively, and could not send what the API server and the operator must withstand."""
    config = yaml.safe_load(cluster.kubeconfig_path.read_text())
    server = config["clusters"][0]["cluster"]["server"]
    body = (f'{{"apiVersion": "{GROUP}/v1alpha1", "kind": "MiniCPMSpeech", '
            f'"metadata": {{"name": "{NAME}", "namespace": "{cluster.namespace}"}}, '
            f'"spec": {spec_json}}}')
    request = urllib.request.Request(
        f"{server}/apis/{GROUP}/v1alpha1/namespaces/{cluster.namespace}/minicpmspeeches",
        data=body.encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 201


async def test_deep_overrides_are_refused(cluster: Cluster, operator: Operator) -> None:
    # 100 levels: past the limit, within what Kopf itself copies before any handler runs.
    if not cluster.is_emulated:
        pytest.skip("the raw request goes to the emulator's address, without credentials")
    deep = '{"a": ' * 100 + "1" + "}" * 100
    spec = json.dumps(example_spec())[:-1] + f', "profileOverrides": {deep}}}'
    speech = await refused_quickly(cluster, spec)
    message = condition(speech, "Degraded")["message"]
    assert message.startswith("spec.profileOverrides") and "max_depth" in message
