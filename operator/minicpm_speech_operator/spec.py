"""A MiniCPMSpeech spec, defaulted and checked, as frozen values the builders read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .crd_schema import spec_schema, validate_spec, with_defaults


@dataclass(frozen=True, slots=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Exactly one of a pinned hub revision or an existing claim."""

    hub_repo: str | None
    hub_revision: str | None
    hub_token: SecretKeyRef | None
    claim_name: str | None
    claim_path: str
    cache_claim: str | None
    cache_size_limit: str
    served_model_name: str

    @property
    def from_hub(self) -> bool:
        return self.hub_repo is not None


@dataclass(frozen=True, slots=True)
class ProfileRef:
    """A bundled profile by name, or a key of a ConfigMap in the resource's namespace."""

    name: str | None
    configmap_name: str | None
    configmap_key: str

    @property
    def label(self) -> str:
        return self.name or f"configmap/{self.configmap_name}"


@dataclass(frozen=True, slots=True)
class Runtime:
    image: str
    image_pull_policy: str
    base_deploy_config: str
    mps_enabled: bool
    mps_active_thread_percentage: int
    graph_precapture: bool
    port: int
    health_port: int
    startup_timeout_seconds: int
    shm_size_limit: str
    resources: Mapping[str, Any]
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True, slots=True)
class SpeechSpec:
    replicas: int
    model: ModelSource
    profile: ProfileRef
    profile_overrides: Mapping[str, Any]
    runtime: Runtime
    perf: Mapping[str, Any] = field(default_factory=dict)


def parse_spec(raw: Any) -> SpeechSpec:
    """Default and validate a manifest's ``spec``; raises InvalidSpec naming the field."""
    spec = with_defaults(spec_schema(), raw if raw is not None else {})
    validate_spec(spec)
    return SpeechSpec(
        replicas=spec["replicas"],
        model=_model(spec["model"]),
        profile=_profile(spec["profile"]),
        profile_overrides=spec.get("profileOverrides", {}),
        runtime=_runtime(spec["runtime"]),
        perf=spec["perf"],
    )


def _model(model: Mapping[str, Any]) -> ModelSource:
    hub, claim, cache = model.get("huggingFace"), model.get("pvc"), model.get("cache", {})
    token = hub.get("tokenSecretRef") if hub else None
    default_name = hub["repo"] if hub else (claim or {}).get("path") or (claim or {})["claimName"]
    return ModelSource(
        hub_repo=hub["repo"] if hub else None,
        hub_revision=hub["revision"] if hub else None,
        hub_token=SecretKeyRef(token["name"], token["key"]) if token else None,
        claim_name=claim["claimName"] if claim else None,
        claim_path=claim["path"] if claim else "",
        cache_claim=cache.get("claimName"),
        cache_size_limit=cache.get("sizeLimit", "100Gi"),
        served_model_name=model.get("servedModelName", default_name),
    )


def _profile(profile: Mapping[str, Any]) -> ProfileRef:
    ref = profile.get("configMapRef")
    return ProfileRef(
        name=profile.get("name"),
        configmap_name=ref["name"] if ref else None,
        configmap_key=ref["key"] if ref else "profile.yaml",
    )


def _runtime(runtime: Mapping[str, Any]) -> Runtime:
    return Runtime(
        image=runtime["image"],
        image_pull_policy=runtime["imagePullPolicy"],
        base_deploy_config=runtime["baseDeployConfig"],
        mps_enabled=runtime["mps"]["enabled"],
        mps_active_thread_percentage=runtime["mps"]["activeThreadPercentage"],
        graph_precapture=runtime["graphPrecapture"],
        port=runtime["port"],
        health_port=runtime["healthPort"],
        startup_timeout_seconds=runtime["startupTimeoutSeconds"],
        shm_size_limit=runtime["shmSizeLimit"],
        resources=runtime["resources"],
        node_selector=runtime.get("nodeSelector", {}),
        tolerations=tuple(runtime.get("tolerations", ())),
    )
