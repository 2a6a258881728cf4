"""Benchmark Jobs: valid objects, the program's own config parser accepts their config, and
each arm's server is started exactly as the serving Deployment starts it."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from minicpm_speech_operator.manifests import Owner, supervisor_args, vllm_serve_command
from minicpm_speech_operator.perf.jobs import (
    JobRequest,
    build_job,
    build_job_configmap,
    job_name,
    program_config,
)
from minicpm_speech_perf.config import parse_quality, parse_sweep

from .perf_builders import arm, claim_perf_raw, perf_raw
from .test_manifests import KUBERNETES_VERSION

CASES: dict[str, tuple[dict[str, Any], str]] = {
    "dedicated-hub": (perf_raw(), "dedicated"),
    "dedicated-claim-rescore": (claim_perf_raw(rescoreModelPath="ct2/large-v3",
                                               speakerModelPath="wavlm/sv",
                                               artifactsClaim="perf-artifacts"), "dedicated"),
    "maintenance": (perf_raw("maintenance", changes={"runtime": {"mps": {"enabled": False}}}),
                    "maintenance"),
    "live": (perf_raw("live"), "live"),
}


def request(case: str, kind: str, *, baseline: bool = False) -> tuple[Owner, JobRequest]:
    owner, candidate = arm(CASES[case][0])
    old = arm(perf_raw(changes={"profile": {"name": "low-latency"}}))[1] if baseline else None
    return owner, JobRequest(kind, 1, candidate, old)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["sweep", "wer"])
def test_job_and_its_config_are_valid_in_strict_mode(case: str, kind: str) -> None:
    owner, req = request(case, kind, baseline=case != "live")
    job = build_job(owner, req)
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
    configmap = build_job_configmap(owner, req, "job-uid")
    kubernetes_validate.validate(configmap, KUBERNETES_VERSION, strict=True)
    assert configmap["metadata"]["ownerReferences"][0]["kind"] == "Job"


def test_a_speaker_model_on_the_models_claim_turns_on_the_evaluators_sim() -> None:
    """Without one the Job scores SIM with its built-in encoder; with one, the official
    evaluator's WavLM reads it from the claim the ASR models are on."""
    for case, expected in (("dedicated-claim-rescore", "/asr/wavlm/sv"), ("dedicated-hub", None)):
        owner, req = request(case, "wer")
        text = build_job_configmap(owner, req, "uid")["data"]["config.yaml"]
        assert parse_quality(yaml.safe_load(text)).speaker_model == expected


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["sweep", "wer"])
def test_the_program_accepts_the_rendered_config(case: str, kind: str) -> None:
    owner, req = request(case, kind, baseline=True)
    text = build_job_configmap(owner, req, "uid")["data"]["config.yaml"]
    config = yaml.safe_load(text)
    parsed = parse_sweep(config) if kind == "sweep" else parse_quality(config).sweep
    assert parsed.mode == CASES[case][1]
    assert parsed.config_hash == req.config_hash
    assert str(parsed.termination_log) == "/dev/termination-log"


def test_abba_arms_run_the_serving_command_with_each_arms_config() -> None:
    owner, req = request("dedicated-hub", "sweep", baseline=True)
    config = program_config(owner, req, "x")
    a, b = config["arms"]
    assert (a["name"], b["name"]) == ("A", "B")  # A1 B1 B2 A2: the last good is A
    spec = req.candidate.spec
    assert b["command"] == ["minicpm-speech-runtime", "serve", *supervisor_args(spec), "--",
                            *vllm_serve_command(spec, "/etc/perf/candidate.yaml")]
    assert a["command"][-len(vllm_serve_command(spec)):][:8] == [
        *vllm_serve_command(spec, "/etc/perf/baseline.yaml")][:8]
    assert b["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    # Measured only once the supervisor reports warm-up and graph precapture done.
    assert config["server"]["ready_port"] == spec.runtime.health_port
    assert config["server"]["ready_path"] == "/readyz"
    data = build_job_configmap(owner, req, "uid")["data"]
    assert req.baseline is not None
    assert data["baseline.yaml"] == req.baseline.cfg.deploy_config
    assert data["candidate.yaml"] == req.candidate.cfg.deploy_config


def test_the_wer_job_never_has_a_baseline_and_gets_the_asr_volume() -> None:
    owner, req = request("dedicated-claim-rescore", "wer", baseline=True)
    config = program_config(owner, req, "x")
    assert [a["name"] for a in config["arms"]] == ["B"]
    assert config["asr"] == {"whisper_model": "/asr", "device": "cuda:0"}
    assert config["rescore"]["model"] == "/asr/ct2/large-v3"
    assert config["highest_gated_concurrency"] == 8
    pod = build_job(owner, req)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["asr-model"]["persistentVolumeClaim"]["claimName"] == "whisper"
    assert volumes["artifacts"]["persistentVolumeClaim"]["claimName"] == "perf-artifacts"
    assert volumes["model"]["persistentVolumeClaim"]["readOnly"] is True


def test_the_job_has_no_api_rights_one_gpu_and_a_bounded_life() -> None:
    owner, req = request("dedicated-hub", "sweep")
    job = build_job(owner, req)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert container["command"] == ["perf-jobs", "sweep", "--config", "/etc/perf/config.yaml"]
    assert container["terminationMessagePolicy"] == "File"
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["image"] == req.candidate.spec.runtime.image  # the serving image
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["activeDeadlineSeconds"] == 21600
    env = {e["name"]: e for e in container["env"]}
    assert "HF_TOKEN" not in env or "valueFrom" in env["HF_TOKEN"]
    # The serving Service selects component=server: a Job pod is never an endpoint.
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "perf"


def test_live_mode_starts_no_server_and_takes_no_gpu() -> None:
    owner, req = request("live", "sweep", baseline=True)
    config = program_config(owner, req, "x")
    assert config["arms"] == [{"name": "live"}]
    assert config["client"]["base_url"] == "http://speech.voices.svc:8091"
    assert "ready_port" not in config["server"]  # the Service's pods are ready already
    job = build_job(owner, req)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    assert not any(m["name"] in ("dshm", "deploy-config") for m in container["volumeMounts"])
    assert set(build_job_configmap(owner, req, "uid")["data"]) == {"config.yaml"}
    wer = program_config(owner, JobRequest("wer", 1, req.candidate), "x")
    assert wer["asr"]["device"] == "cpu"


def test_perf_image_overrides_the_serving_image() -> None:
    owner, candidate = arm(perf_raw(image="ghcr.io/minicpm-speech/perf:1"))
    job = build_job(owner, JobRequest("sweep", 1, candidate))
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == \
        "ghcr.io/minicpm-speech/perf:1"


def test_job_names_are_deterministic_and_fit_a_label_value() -> None:
    owner = Owner("speech", "voices", "u")
    assert job_name(owner, "sweep", "abcdef012345", 1) == "speech-sweep-abcdef012345"
    assert job_name(owner, "wer", "abcdef012345", 3) == "speech-wer-abcdef012345-3"
    long_a, long_b = Owner("a" * 60 + "x", "n", "u"), Owner("a" * 60 + "y", "n", "u")
    name_a = job_name(long_a, "sweep", "abcdef012345", 2)
    assert len(name_a) <= 63 and name_a.endswith("-sweep-abcdef012345-2")
    assert name_a != job_name(long_b, "sweep", "abcdef012345", 2)
    assert name_a == job_name(long_a, "sweep", "abcdef012345", 2)
