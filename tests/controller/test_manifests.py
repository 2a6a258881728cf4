"""Rendered children: valid Kubernetes objects that carry the pod contract."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
from minicpm_speech_contract import shutdown, supervisor
from minicpm_speech_operator.assets import asset_dir
from minicpm_speech_operator.manifests import (
    CONFIG_HASH_KEY,
    build_children,
    owner_of,
)
from minicpm_speech_operator.serving_config import profile_document, serving_config
from minicpm_speech_operator.spec import parse_spec

from .builders import claim_spec, speech_body

KUBERNETES_VERSION = "1.33.0"


def render(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    body = speech_body(spec)
    parsed = parse_spec(body["spec"])
    cfg = serving_config(parsed, profile_document(parsed, None))
    return {child["kind"]: child for child in build_children(owner_of(body), parsed, cfg)}


def container(children: dict[str, dict[str, Any]]) -> dict[str, Any]:
    pod = children["Deployment"]["spec"]["template"]["spec"]
    only: dict[str, Any] = pod["containers"][0]
    return only


SPECS = {
    "example": speech_body()["spec"],
    "claim-no-mps": claim_spec(mps={"enabled": False}, graphPrecapture=False),
    "scaled-out": {**claim_spec(nodeSelector={"gpu": "h200"}, tolerations=[
        {"key": "dedicated", "operator": "Equal", "value": "speech", "effect": "NoSchedule"}]),
        "replicas": 3, "profile": {"name": "high-concurrency"}},
    "hub-token": {"model": {"huggingFace": {
        "repo": "openbmb/MiniCPM-o-4_5", "revision": "0" * 40,
        "tokenSecretRef": {"name": "hf"}}, "cache": {"claimName": "hub-cache"}}},
    # Talker streams half as long as its context allows
    "short-talker": {**speech_body()["spec"], "profileOverrides": {
        "stages": [{"stage_id": 1, "max_model_len": 2048}]}},
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_every_child_is_valid_in_strict_mode(case: str) -> None:
    for child in render(SPECS[case]).values():
        kubernetes_validate.validate(child, KUBERNETES_VERSION, strict=True)


def test_pod_takes_exactly_one_gpu_and_never_surges() -> None:
    one = render(SPECS["example"])["Deployment"]["spec"]
    many = render(SPECS["scaled-out"])["Deployment"]["spec"]
    assert container(render(SPECS["example"]))["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert one["strategy"] == {"type": "Recreate"}
    assert many["replicas"] == 3
    assert many["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_server_command_runs_vllm_omni_with_the_rendered_config() -> None:
    args = container(render(SPECS["example"]))["args"]
    server = args[args.index("--") + 1:]
    assert server[:4] == ["vllm", "serve", "openbmb/MiniCPM-o-4_5", "--omni"]
    assert server[server.index("--deploy-config") + 1] == "/etc/minicpm-speech/deploy-config.yaml"
    assert server[server.index("--revision") + 1] == SPECS["example"]["model"]["huggingFace"][
        "revision"]


def test_mps_on_means_daemon_dirs_on_emptydirs_and_supervisor_flag() -> None:
    children = render(SPECS["example"])
    c = container(children)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert "--mps" in c["args"] and env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/nvidia-mps"
    volumes = {v["name"]: v for v in children["Deployment"]["spec"]["template"]["spec"]["volumes"]}
    assert "emptyDir" in volumes["mps-pipe"] and "emptyDir" in volumes["mps-log"]


def test_mps_off_leaves_no_mps_trace() -> None:
    c = container(render(SPECS["claim-no-mps"]))
    assert "--no-mps" in c["args"] and "--no-precapture" in c["args"]
    assert not any(e["name"].startswith("CUDA_MPS") for e in c["env"])


def test_probes_gate_readiness_on_warmup_and_size_startup_for_load() -> None:
    c = container(render(SPECS["example"]))
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 9400}
    assert c["livenessProbe"]["httpGet"]["path"] == "/livez"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800


def test_hub_token_travels_by_reference_only() -> None:
    children = render(SPECS["hub-token"])
    env = {e["name"]: e for e in container(children)["env"]}
    assert env["HF_TOKEN"] == {"name": "HF_TOKEN", "valueFrom": {
        "secretKeyRef": {"name": "hf", "key": "token"}}}
    assert "hf" not in str(children["ConfigMap"]["data"])


def test_every_child_is_owned_labelled_and_hashed() -> None:
    children = render(SPECS["example"])
    hashes = {child["metadata"]["labels"][CONFIG_HASH_KEY] for child in children.values()}
    assert len(hashes) == 1
    template = children["Deployment"]["spec"]["template"]["metadata"]
    assert template["annotations"][CONFIG_HASH_KEY] in hashes
    for child in children.values():
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref["uid"] == "uid-1" and ref["controller"] is True


def test_profile_change_changes_the_hash_and_the_pod_template() -> None:
    before = render(SPECS["example"])["Deployment"]
    after = render({**SPECS["example"], "profile": {"name": "low-latency"}})["Deployment"]
    assert before["spec"]["template"] != after["spec"]["template"]


def test_same_spec_same_bytes() -> None:
    assert render(SPECS["example"]) == render(SPECS["example"])


def pod_shutdown(case: str) -> tuple[dict[str, Any], supervisor.SupervisorArgs, list[str]]:
    """The pod spec, and its supervisor's options and server command as the pod parses them."""
    children = render(SPECS[case])
    pod = children["Deployment"]["spec"]["template"]["spec"]
    args, server = supervisor.parse([SUBCOMMAND_SERVE, *container(children)["args"]])
    return pod, args, server


SUBCOMMAND_SERVE = supervisor.SUBCOMMAND


@pytest.mark.parametrize("case", ["example", "claim-no-mps", "short-talker"])
def test_the_grace_period_covers_the_prestop_the_drain_and_the_servers_stop(case: str) -> None:
    pod, args, server = pod_shutdown(case)
    (hook,) = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1:]
    steps = float(hook) + args.drain_seconds + args.grace_seconds + shutdown.MPS_QUIT_SECONDS
    assert pod["terminationGracePeriodSeconds"] >= steps
    # The drain outlasts the longest stream the profile's Talker can produce, at real time.
    talker = 2048 if case == "short-talker" else 4096
    assert args.drain_seconds >= talker / shutdown.SPEECH_TOKENS_PER_SECOND
    # The API server counts its requests, which is what the drain waits for.
    assert server[server.index("--middleware") + 1] == supervisor.DRAIN_MIDDLEWARE


def test_the_drain_follows_the_profiles_talker() -> None:
    full, full_args, _ = pod_shutdown("example")
    short, short_args, _ = pod_shutdown("short-talker")
    assert full_args.drain_seconds == 2 * short_args.drain_seconds
    assert full["terminationGracePeriodSeconds"] > short["terminationGracePeriodSeconds"]


def test_no_profile_can_make_a_stream_outlast_the_default_drain() -> None:
    """The profile schema caps the Talker's max_model_len at the length the contract's
    default drain bound is derived from."""
    schema = json.loads((asset_dir("profiles") / "schema.json").read_text())
    caps = [rule["then"]["properties"]["max_model_len"]["maximum"]
            for rule in schema["$defs"]["stage"]["allOf"]
            if rule["if"]["properties"]["stage_id"] == {"const": 1}]
    assert caps == [shutdown.TALKER_MAX_MODEL_LEN]
    assert shutdown.drain_seconds(caps[0]) == supervisor.DEFAULT_DRAIN_SECONDS
