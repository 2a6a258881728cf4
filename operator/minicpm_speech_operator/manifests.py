"""Pure builders: (resource, spec, serving config) -> the child objects as plain dicts.

The pod contract with the serving image lives here: the image's ``minicpm-speech-runtime
serve`` supervisor starts the MPS control daemon (when asked), then the exact
``vllm serve ... --omni`` command given after ``--``, runs the warm-up that precaptures
every CUDA graph, and only then answers 200 on ``/readyz`` of the health port.
``/livez`` answers 200 while the server process and MPS daemon are alive. A pod leaving
service drains first: its preStop waits while its endpoint's removal spreads, then SIGTERM
makes the supervisor refuse new streams and wait for those in flight, bounded by the longest
stream the profile's Talker can produce (:mod:`minicpm_speech_contract.shutdown`), and the
termination grace period is derived from those bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml
from minicpm_speech_contract import shutdown
from minicpm_speech_contract.supervisor import (
    EXECUTABLE,
    SUBCOMMAND,
    SupervisorArgs,
    vllm_serve_argv,
)

from .autoscaling import target_quantity
from .names import DEPLOY_CONFIG_SUFFIX
from .serving_config import ServingConfig
from .spec import SpeechSpec

GROUP = "serving.minicpm-speech.io"
API_VERSION = f"{GROUP}/v1alpha1"
KIND = "MiniCPMSpeech"
CONFIG_HASH_KEY = f"{GROUP}/config-hash"
MANAGED_BY = "minicpm-speech-operator"

DEPLOY_CONFIG_FILE = "deploy-config.yaml"
DEPLOY_CONFIG_DIR = "/etc/minicpm-speech"
MODEL_DIR = "/models"
CACHE_DIR = "/var/cache/minicpm-speech"
MPS_PIPE_DIR = "/run/nvidia-mps"
MPS_LOG_DIR = "/var/log/nvidia-mps"
SERVING_UID = 1000
STARTUP_PROBE_PERIOD_SECONDS = 10


@dataclass(frozen=True, slots=True)
class Owner:
    name: str
    namespace: str
    uid: str


def owner_of(body: dict[str, Any]) -> Owner:
    meta = body["metadata"]
    return Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])


def selector_labels(owner: Owner) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "minicpm-speech",
        "app.kubernetes.io/instance": owner.name,
        "app.kubernetes.io/component": "server",
    }


def child_labels(owner: Owner, cfg: ServingConfig) -> dict[str, str]:
    return {
        **selector_labels(owner),
        "app.kubernetes.io/managed-by": MANAGED_BY,
        CONFIG_HASH_KEY: cfg.config_hash,
    }


def configmap_name(owner: Owner) -> str:
    return f"{owner.name}{DEPLOY_CONFIG_SUFFIX}"


def endpoint_url(owner: Owner, spec: SpeechSpec) -> str:
    return f"http://{owner.name}.{owner.namespace}.svc:{spec.runtime.port}/v1"


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(owner: Owner, name: str, cfg: ServingConfig) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": child_labels(owner, cfg),
        "ownerReferences": [owner_reference(owner)],
    }


def build_configmap(owner: Owner, cfg: ServingConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(owner, configmap_name(owner), cfg),
        "data": {DEPLOY_CONFIG_FILE: cfg.deploy_config},
    }


def build_service(owner: Owner, spec: SpeechSpec, cfg: ServingConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, owner.name, cfg),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(owner),
            "ports": [
                {"name": "http", "port": spec.runtime.port, "targetPort": "http"},
                {"name": "metrics", "port": spec.runtime.health_port, "targetPort": "health"},
            ],
        },
    }


def build_deployment(owner: Owner, spec: SpeechSpec, cfg: ServingConfig) -> dict[str, Any]:
    """While autoscaling is on, ``spec.replicas`` is minReplicas here, but it is written only
    when the Deployment is created (:data:`HPA_OWNED`): from then on the count is the HPA's."""
    scaling = spec.autoscaling
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, owner.name, cfg),
        "spec": {
            "replicas": scaling.min_replicas if scaling.enabled else spec.replicas,
            "selector": {"matchLabels": selector_labels(owner)},
            "strategy": _rollout_strategy(most_replicas(spec)),
            # A stuck rollout is reported only after the longest legitimate start.
            "progressDeadlineSeconds": spec.runtime.startup_timeout_seconds + 600,
            "template": {
                "metadata": {
                    "labels": child_labels(owner, cfg),
                    "annotations": {CONFIG_HASH_KEY: cfg.config_hash},
                },
                "spec": _pod_spec(owner, spec, cfg),
            },
        },
    }


# The Deployment's fields the HorizontalPodAutoscaler owns while autoscaling is on: the
# operator sets them when it creates the Deployment and never patches them afterwards.
HPA_OWNED: dict[str, list[tuple[str, ...]]] = {"Deployment": [("spec", "replicas")]}
# Scale-down is slow and one pod at a time: a burst's lull must not take away a pod that took
# minutes to warm up, only for the next burst to wait for a new one. Scale-up is the HPA's
# default (double, or add four, every 15 s), since a pod takes minutes to join anyway.
SCALE_DOWN_STABILIZATION_SECONDS = 600
SCALE_DOWN_PERIOD_SECONDS = 300


def most_replicas(spec: SpeechSpec) -> int:
    """The most serving pods the spec can run at once."""
    scaling = spec.autoscaling
    return (scaling.max_replicas or 1) if scaling.enabled else spec.replicas


def build_hpa(owner: Owner, spec: SpeechSpec, cfg: ServingConfig) -> dict[str, Any]:
    """The HorizontalPodAutoscaler of an autoscaled resource (why an HPA: autoscaling.py).

    A ``Pods`` metric, the per-pod value the Prometheus Adapter serves from each serving pod's
    own ``/metrics``, averaged over the pods and held at ``averageValue``."""
    scaling = spec.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(owner, owner.name, cfg),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                               "name": owner.name},
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [{"type": "Pods", "pods": {
                "metric": {"name": scaling.pod_metric.name},
                "target": {"type": "AverageValue", "averageValue": target_quantity(scaling)},
            }}],
            "behavior": {"scaleDown": {
                "stabilizationWindowSeconds": SCALE_DOWN_STABILIZATION_SECONDS,
                "selectPolicy": "Min",
                "policies": [{"type": "Pods", "value": 1,
                              "periodSeconds": SCALE_DOWN_PERIOD_SECONDS}],
            }},
        },
    }


def build_children(owner: Owner, spec: SpeechSpec, cfg: ServingConfig) -> list[dict[str, Any]]:
    """In apply order: the config exists before the pod that mounts it, and the Deployment
    before the autoscaler that scales it."""
    children = [
        build_configmap(owner, cfg),
        build_deployment(owner, spec, cfg),
        build_service(owner, spec, cfg),
    ]
    if spec.autoscaling.enabled:
        children.append(build_hpa(owner, spec, cfg))
    return children


def _rollout_strategy(replicas: int) -> dict[str, Any]:
    # Each pod holds a whole GPU: a surge pod would wait for a GPU that is not free.
    if replicas <= 1:
        return {"type": "Recreate"}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}}


def talker_max_model_len(cfg: ServingConfig) -> int:
    """Stage 1's ``max_model_len`` in the rendered deploy config, else vLLM-Omni's base value:
    the most speech codes, so the most audio, one stream can carry."""
    document = yaml.safe_load(cfg.deploy_config)
    stages = document.get("stages") if isinstance(document, dict) else None
    for stage in stages if isinstance(stages, list) else []:
        if isinstance(stage, dict) and stage.get("stage_id") == 1:
            length = stage.get("max_model_len")
            if isinstance(length, int) and not isinstance(length, bool) and length > 0:
                return length
    return shutdown.TALKER_MAX_MODEL_LEN


def _pod_spec(owner: Owner, spec: SpeechSpec, cfg: ServingConfig) -> dict[str, Any]:
    drain = shutdown.drain_seconds(talker_max_model_len(cfg))
    args = supervisor_arguments(spec, drain_seconds=drain)
    return {
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": args.termination_grace_seconds(),
        "enableServiceLinks": False,
        "containers": [_server_container(spec, args)],
        "volumes": server_volumes(owner, spec),
        **gpu_placement(spec),
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": SERVING_UID,
        "runAsGroup": SERVING_UID,
        "fsGroup": SERVING_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def gpu_placement(spec: SpeechSpec) -> dict[str, Any]:
    """Tolerations and node selector of a pod that runs where the serving pods run."""
    rt = spec.runtime
    placement: dict[str, Any] = {"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        *rt.tolerations,
    ]}
    if rt.node_selector:
        placement["nodeSelector"] = dict(rt.node_selector)
    return placement


def server_resources(spec: SpeechSpec, *, gpu: bool = True) -> dict[str, Any]:
    resources = {kind: dict(values) for kind, values in spec.runtime.resources.items()}
    if gpu:
        # Quantities are strings in the API; the client refuses a bare number here.
        resources.setdefault("limits", {})["nvidia.com/gpu"] = "1"
        resources.setdefault("requests", {})["nvidia.com/gpu"] = "1"
    return resources


def _server_container(spec: SpeechSpec, args: SupervisorArgs) -> dict[str, Any]:
    rt = spec.runtime
    return {
        "name": "server",
        "image": rt.image,
        "imagePullPolicy": rt.image_pull_policy,
        "command": [EXECUTABLE, SUBCOMMAND],
        "args": [*args.to_argv(), "--", *vllm_serve_command(spec)],
        "env": server_environment(spec),
        "ports": [
            {"name": "http", "containerPort": rt.port, "protocol": "TCP"},
            {"name": "health", "containerPort": rt.health_port, "protocol": "TCP"},
        ],
        "resources": server_resources(spec),
        "volumeMounts": server_volume_mounts(spec),
        "startupProbe": _probe("/readyz", rt.health_port, period=STARTUP_PROBE_PERIOD_SECONDS,
                               failures=math.ceil(rt.startup_timeout_seconds
                                                  / STARTUP_PROBE_PERIOD_SECONDS)),
        "readinessProbe": _probe("/readyz", rt.health_port, period=5, failures=3),
        "livenessProbe": _probe("/livez", rt.health_port, period=10, failures=6),
        # Deleting a pod removes its endpoint and sends SIGTERM at once, but kube-proxy and
        # ingresses learn of the removal only a few seconds later; the supervisor refuses new
        # streams from SIGTERM on, so without this wait the requests still routed here in
        # those seconds would be refused (and retried) instead of served. `sleep` is the
        # image's (Ubuntu); the preStop sleep action needs Kubernetes 1.30, the chart 1.29.
        "lifecycle": {"preStop": {"exec": {
            "command": ["sleep", str(shutdown.PRESTOP_SECONDS)]}}},
        "securityContext": container_security_context(),
    }


def supervisor_arguments(
    spec: SpeechSpec, *, drain_seconds: float = shutdown.DRAIN_SECONDS
) -> SupervisorArgs:
    rt = spec.runtime
    return SupervisorArgs(
        health_port=rt.health_port,
        server_port=rt.port,
        mps=rt.mps_enabled,
        mps_active_thread_percentage=rt.mps_active_thread_percentage if rt.mps_enabled else None,
        precapture=rt.graph_precapture,
        drain_seconds=drain_seconds,
    )


def supervisor_args(spec: SpeechSpec) -> list[str]:
    """The options with the contract's default drain bound (the perf Job's server arm)."""
    return supervisor_arguments(spec).to_argv()


def model_target(spec: SpeechSpec) -> str:
    """What `vllm serve` loads: the hub repository id, or the checkpoint folder in the claim."""
    model = spec.model
    return str(model.hub_repo if model.from_hub else f"{MODEL_DIR}/{model.claim_path}".rstrip("/"))


def vllm_serve_command(
    spec: SpeechSpec, deploy_config: str = f"{DEPLOY_CONFIG_DIR}/{DEPLOY_CONFIG_FILE}"
) -> list[str]:
    return vllm_serve_argv(
        model_target(spec), deploy_config=deploy_config, port=spec.runtime.port,
        served_model_name=spec.model.served_model_name, revision=spec.model.hub_revision,
    )


def server_environment(spec: SpeechSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "VLLM_WORKER_MULTIPROC_METHOD", "value": "spawn"},
        {"name": "TOKENIZERS_PARALLELISM", "value": "false"},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "HF_HUB_OFFLINE", "value": "0" if spec.model.from_hub else "1"},
    ]
    token = spec.model.hub_token
    if token is not None:
        # By reference only: the token never appears in the Deployment or any ConfigMap.
        env.append({"name": "HF_TOKEN", "valueFrom": {
            "secretKeyRef": {"name": token.name, "key": token.key}}})
    if spec.runtime.mps_enabled:
        env += [
            {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": MPS_PIPE_DIR},
            {"name": "CUDA_MPS_LOG_DIRECTORY", "value": MPS_LOG_DIR},
            {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
             "value": str(spec.runtime.mps_active_thread_percentage)},
        ]
    return env


def server_volume_mounts(spec: SpeechSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": "deploy-config", "mountPath": DEPLOY_CONFIG_DIR, "readOnly": True},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if not spec.model.from_hub:
        mounts.append({"name": "model", "mountPath": MODEL_DIR, "readOnly": True})
    if spec.runtime.mps_enabled:
        mounts += [
            {"name": "mps-pipe", "mountPath": MPS_PIPE_DIR},
            {"name": "mps-log", "mountPath": MPS_LOG_DIR},
        ]
    return mounts


def server_volumes(owner: Owner, spec: SpeechSpec) -> list[dict[str, Any]]:
    model, rt = spec.model, spec.runtime
    cache: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": model.cache_claim}}
        if model.cache_claim
        else {"emptyDir": {"sizeLimit": model.cache_size_limit}}
    )
    volumes: list[dict[str, Any]] = [
        {"name": "deploy-config", "configMap": {"name": configmap_name(owner)}},
        {"name": "cache", **cache},
        # The pipeline's stages hand tensors to each other through shared memory.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": rt.shm_size_limit}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if not model.from_hub:
        volumes.append({"name": "model", "persistentVolumeClaim": {
            "claimName": model.claim_name, "readOnly": True}})
    if rt.mps_enabled:
        volumes += [{"name": "mps-pipe", "emptyDir": {}}, {"name": "mps-log", "emptyDir": {}}]
    return volumes


def _probe(path: str, port: int, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }
