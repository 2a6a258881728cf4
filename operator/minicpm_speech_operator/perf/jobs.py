"""Pure builders of the benchmark Jobs: names, labels, the program's config, the Job itself.

The Job runs the `perf-jobs` program (perf-jobs/README.md). Its contract with the operator is
a config file mounted from a ConfigMap the Job owns, and a compact result in the pod's
termination message, so the Job needs no Kubernetes API rights at all. Each arm's server is
started exactly as the serving Deployment starts it: the runtime's supervisor, then the same
`vllm serve` command, pointed at that arm's rendered deploy config.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from minicpm_speech_contract.supervisor import EXECUTABLE, SUBCOMMAND

from ..manifests import (
    CONFIG_HASH_KEY,
    GROUP,
    MANAGED_BY,
    Owner,
    container_security_context,
    gpu_placement,
    model_target,
    owner_reference,
    pod_security_context,
    server_environment,
    server_resources,
    server_volume_mounts,
    server_volumes,
    supervisor_args,
    vllm_serve_command,
)
from ..serving_config import ServingConfig
from ..spec import SpeechSpec

Kind = Literal["sweep", "wer"]
KINDS: tuple[Kind, ...] = ("sweep", "wer")
COMPONENT = "perf"
PERF_KIND_KEY = f"{GROUP}/perf-kind"
ATTEMPT_KEY = f"{GROUP}/perf-attempt"
PLACEMENT_KEY = f"{GROUP}/perf-placement"

CONFIG_DIR = "/etc/perf"
CONFIG_FILE = "config.yaml"
CANDIDATE_FILE = "candidate.yaml"
BASELINE_FILE = "baseline.yaml"
DATA_DIR = "/data"
ASR_DIR = "/asr"
ARTIFACTS_DIR = "/artifacts"
TERMINATION_LOG = "/dev/termination-log"
CONTAINER = "perf"
# ABBA's names as the protocol writes them: A is the last good, B the candidate.
BASELINE_ARM, CANDIDATE_ARM, LIVE_ARM = "A", "B", "live"
# Job names become the pods' `job-name` label value, which is limited to 63 characters.
MAX_JOB_NAME = 63


@dataclass(frozen=True, slots=True)
class Arm:
    """One serving configuration a Job measures: its spec and its rendered deploy config."""

    spec: SpeechSpec
    cfg: ServingConfig


@dataclass(frozen=True, slots=True)
class JobRequest:
    """One Job to create: which kind, which attempt, and what it compares."""

    kind: Kind
    attempt: int
    candidate: Arm
    baseline: Arm | None = None  # sweep only, and never in live mode

    @property
    def config_hash(self) -> str:
        return self.candidate.cfg.config_hash


def job_name(owner: Owner, kind: Kind, config_hash: str, attempt: int) -> str:
    """NAME-KIND-HASH for the first attempt, NAME-KIND-HASH-N for a retry, at most 63 long.

    A resource name too long to fit is cut and given a digest of the whole name, so two
    resources whose names share a long prefix never share a Job.
    """
    suffix = f"-{kind}-{config_hash}" + (f"-{attempt}" if attempt > 1 else "")
    prefix = owner.name
    if len(prefix) + len(suffix) > MAX_JOB_NAME:
        digest = hashlib.sha256(owner.name.encode()).hexdigest()[:8]
        prefix = owner.name[: MAX_JOB_NAME - len(suffix) - len(digest) - 1].rstrip("-.")
        prefix = f"{prefix}-{digest}"
    return prefix + suffix


def perf_selector(owner: Owner) -> dict[str, str]:
    """Labels every Job of this resource carries; the component keeps them out of the
    serving Service's selector."""
    return {
        "app.kubernetes.io/name": "minicpm-speech",
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def perf_labels(owner: Owner, request: JobRequest, placement: str) -> dict[str, str]:
    return {
        **perf_selector(owner),
        CONFIG_HASH_KEY: request.config_hash,
        PERF_KIND_KEY: request.kind,
        ATTEMPT_KEY: str(request.attempt),
        PLACEMENT_KEY: placement,
    }


def label_selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def service_url(owner: Owner, spec: SpeechSpec) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc:{spec.runtime.port}"


def _subdir(root: str, path: str) -> str:
    return f"{root}/{path}".rstrip("/")


def _is_live(spec: SpeechSpec) -> bool:
    return spec.perf.placement == "live"


def _arm(name: str, arm: Arm, candidate: SpeechSpec, file: str) -> dict[str, Any]:
    # Both arms answer on the candidate's ports: the program checks one ready URL.
    runtime = dataclasses.replace(arm.spec.runtime, port=candidate.runtime.port,
                                  health_port=candidate.runtime.health_port)
    spec = dataclasses.replace(arm.spec, runtime=runtime)
    command = [EXECUTABLE, SUBCOMMAND, *supervisor_args(spec), "--",
               *vllm_serve_command(spec, f"{CONFIG_DIR}/{file}")]
    # Plain values only: a Secret reaches the server through the container's environment.
    env = {e["name"]: e["value"] for e in server_environment(spec) if "value" in e}
    return {"name": name, "command": command, "env": env}


def _server_settings(spec: SpeechSpec, live: bool) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "port": spec.runtime.port,
        "ready_path": "/health",
        "ready_timeout_s": spec.runtime.startup_timeout_seconds,
    }
    if not live:
        # A fresh server counts as ready when its supervisor says so: warm-up and graph
        # precapture done, exactly as for a serving pod. (Live: the Service's pods are.)
        settings |= {"ready_port": spec.runtime.health_port, "ready_path": "/readyz"}
    return settings


def program_config(owner: Owner, request: JobRequest, name: str) -> dict[str, Any]:
    """The `perf-jobs` config file (perf-jobs/examples/*.yaml) of one Job."""
    spec = request.candidate.spec
    perf = spec.perf
    live = _is_live(spec)
    client: dict[str, Any] = {
        "model": spec.model.served_model_name,
        "tokenizer": model_target(spec),
        "dataset_root": _subdir(DATA_DIR, perf.dataset_path),
    }
    if live:
        client["base_url"] = service_url(owner, spec)
        arms: list[dict[str, Any]] = [{"name": LIVE_ARM}]
    else:
        arms = [_arm(CANDIDATE_ARM, request.candidate, spec, CANDIDATE_FILE)]
        if request.baseline is not None and request.kind == "sweep":
            arms.insert(0, _arm(BASELINE_ARM, request.baseline, spec, BASELINE_FILE))
    config: dict[str, Any] = {
        "mode": perf.placement,
        "config_hash": request.config_hash,
        "artifacts_dir": f"{ARTIFACTS_DIR}/{name}",
        "termination_log": TERMINATION_LOG,
        "client": client,
        "server": _server_settings(spec, live),
        "arms": arms,
    }
    if request.kind == "sweep":
        config["concurrencies"] = list(perf.concurrencies)
        config["gpu_index"] = 0
        return config
    # Live mode has no GPU of its own: the evaluators run on the CPU.
    device = "cpu" if live else "cuda:0"
    config["highest_gated_concurrency"] = perf.highest_gated_concurrency
    config["asr"] = {"whisper_model": _subdir(ASR_DIR, perf.asr_model_path), "device": device}
    if perf.rescore_model_path:
        config["rescore"] = {
            "model": _subdir(ASR_DIR, perf.rescore_model_path),
            "device": device,
            "compute_type": "int8" if live else "float16",
        }
    if perf.speaker_model_path:
        config["similarity"] = {"speaker_model": _subdir(ASR_DIR, perf.speaker_model_path)}
    return config


def build_job(owner: Owner, request: JobRequest) -> dict[str, Any]:
    spec = request.candidate.spec
    perf = spec.perf
    name = job_name(owner, request.kind, request.config_hash, request.attempt)
    labels = perf_labels(owner, request, perf.placement)
    pod_labels = {k: v for k, v in labels.items() if k != "app.kubernetes.io/managed-by"}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # The result leaves through the termination message: the Job needs no API rights.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        # The program stops its server within 60 s and then writes its result.
        "terminationGracePeriodSeconds": 120,
        "containers": [_container(request)],
        "volumes": _volumes(owner, request, name),
    }
    if not _is_live(spec):
        pod |= gpu_placement(spec)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(owner)],
        },
        "spec": {
            "backoffLimit": perf.job.backoff_limit,
            "activeDeadlineSeconds": perf.job.active_deadline_seconds,
            "template": {"metadata": {"labels": pod_labels}, "spec": pod},
        },
    }


def build_job_configmap(owner: Owner, request: JobRequest, job_uid: str) -> dict[str, Any]:
    """The Job's config, owned by the created Job (``job_uid``), so it goes wherever the
    Job goes: no delete right on ConfigMaps is needed."""
    name = job_name(owner, request.kind, request.config_hash, request.attempt)
    data = {CONFIG_FILE: yaml.safe_dump(program_config(owner, request, name),
                                        sort_keys=False, width=1000)}
    # Live mode starts no server, so it has no deploy config to mount.
    if not _is_live(request.candidate.spec):
        data[CANDIDATE_FILE] = request.candidate.cfg.deploy_config
        if request.baseline is not None and request.kind == "sweep":
            data[BASELINE_FILE] = request.baseline.cfg.deploy_config
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": perf_labels(owner, request, request.candidate.spec.perf.placement),
            "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": name,
                "uid": job_uid, "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "data": data,
    }


def _container(request: JobRequest) -> dict[str, Any]:
    spec = request.candidate.spec
    live = _is_live(spec)
    program = ["sweep"] if request.kind == "sweep" else ["wer", "run"]
    env = [e for e in server_environment(spec)
           if not (live and e["name"].startswith("CUDA_MPS_"))]
    return {
        "name": CONTAINER,
        "image": spec.perf.image or spec.runtime.image,
        "imagePullPolicy": spec.runtime.image_pull_policy,
        "command": ["perf-jobs", *program, "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        "env": env,
        "resources": server_resources(spec, gpu=not live),
        "volumeMounts": _mounts(request),
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": container_security_context(),
    }


def _serving_side(request: JobRequest) -> SpeechSpec:
    """The candidate's spec, with MPS volumes when any arm runs MPS."""
    spec = request.candidate.spec
    if _is_live(spec):
        spec = dataclasses.replace(spec, runtime=dataclasses.replace(spec.runtime,
                                                                     mps_enabled=False))
    elif request.baseline is not None and request.baseline.spec.runtime.mps_enabled:
        spec = dataclasses.replace(spec, runtime=dataclasses.replace(spec.runtime,
                                                                     mps_enabled=True))
    return spec


# Server volumes a live-mode client does not need: there is no server in its pod.
_SERVER_ONLY = {"deploy-config", "dshm", "mps-pipe", "mps-log"}


def _mounts(request: JobRequest) -> list[dict[str, Any]]:
    skip = _SERVER_ONLY if _is_live(request.candidate.spec) else {"deploy-config"}
    mounts = [m for m in server_volume_mounts(_serving_side(request)) if m["name"] not in skip]
    mounts += [
        {"name": "perf-config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "dataset", "mountPath": DATA_DIR, "readOnly": True},
        {"name": "artifacts", "mountPath": ARTIFACTS_DIR},
    ]
    if request.kind == "wer":
        mounts.append({"name": "asr-model", "mountPath": ASR_DIR, "readOnly": True})
    return mounts


def _volumes(owner: Owner, request: JobRequest, name: str) -> list[dict[str, Any]]:
    perf = request.candidate.spec.perf
    skip = _SERVER_ONLY if _is_live(request.candidate.spec) else {"deploy-config"}
    volumes = [v for v in server_volumes(owner, _serving_side(request)) if v["name"] not in skip]
    artifacts: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": perf.artifacts_claim}}
        if perf.artifacts_claim else {"emptyDir": {"sizeLimit": "20Gi"}}
    )
    volumes += [
        {"name": "perf-config", "configMap": {"name": name}},
        {"name": "dataset", "persistentVolumeClaim": {"claimName": perf.dataset_claim,
                                                      "readOnly": True}},
        {"name": "artifacts", **artifacts},
    ]
    if request.kind == "wer":
        volumes.append({"name": "asr-model", "persistentVolumeClaim": {
            "claimName": perf.asr_model_claim, "readOnly": True}})
    return volumes
