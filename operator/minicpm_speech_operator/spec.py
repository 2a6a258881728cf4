"""A MiniCPMSpeech spec, defaulted and checked, as frozen values the builders read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from kubernetes.utils.quantity import parse_quantity
from minicpm_speech_contract.bounded import BoundedInputError, check_parsed

from .autoscaling import Autoscaling, check_autoscaling, parse_autoscaling
from .crd_schema import spec_schema, validate_spec, with_defaults
from .errors import InvalidSpec, refuse_repeats
from .profiles import bundled_profile_names
from .slo import Search, Slo, check_search, check_slo, parse_search, parse_slo

Placement = Literal["dedicated", "maintenance", "live"]


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
    search: Search

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
class Gate:
    """Thresholds a new configuration must meet against its baseline."""

    concurrencies: tuple[int, ...]
    max_throughput_loss_percent: float
    max_first_audio_p95_rise_percent: float
    max_wer_percent: float
    max_wer_increase_points: float
    max_sim_drop: float
    max_mos_drop: float


@dataclass(frozen=True, slots=True)
class JobPolicy:
    active_deadline_seconds: int
    backoff_limit: int
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Perf:
    """spec.perf: where and how the benchmark Jobs run, and the gate they feed."""

    enabled: bool
    placement: Placement
    concurrencies: tuple[int, ...]
    headline_concurrency: int
    dataset_claim: str | None
    dataset_path: str
    asr_model_claim: str | None
    asr_model_path: str
    rescore_model_path: str | None
    speaker_model_path: str | None
    artifacts_claim: str | None
    image: str | None
    history_limit: int
    rollback: bool
    job: JobPolicy
    gate: Gate

    @property
    def highest_gated_concurrency(self) -> int:
        return max(self.gate.concurrencies)


@dataclass(frozen=True, slots=True)
class SpeechSpec:
    replicas: int
    autoscaling: Autoscaling
    model: ModelSource
    profile: ProfileRef
    profile_overrides: Mapping[str, Any]
    runtime: Runtime
    perf: Perf
    slo: Slo | None
    raw: Mapping[str, Any]  # the defaulted spec, kept so a last good config can be rebuilt


def parse_spec(raw: Any) -> SpeechSpec:
    """Default and validate a manifest's ``spec``; raises InvalidSpec naming the field."""
    try:  # first: overrides arrive parsed, of any depth or size, and defaulting copies them
        check_parsed(raw, field="spec")
    except BoundedInputError as error:
        raise InvalidSpec(error.field, error.message, error.fix) from None
    spec = with_defaults(spec_schema(), raw if raw is not None else {})
    validate_spec(spec)
    parsed = SpeechSpec(
        replicas=spec["replicas"],
        autoscaling=parse_autoscaling(spec["autoscaling"]),
        model=_model(spec["model"]),
        profile=_profile(spec["profile"]),
        profile_overrides=spec.get("profileOverrides", {}),
        runtime=_runtime(spec["runtime"]),
        perf=_perf(spec["perf"]),
        slo=parse_slo(spec.get("slo")),
        raw=spec,
    )
    check_runtime(parsed.runtime)
    check_autoscaling(parsed.autoscaling)
    check_perf(parsed)
    check_slo(parsed.slo, parsed.perf.concurrencies)
    check_search(parsed.profile.search, parsed.slo, parsed.perf.enabled, parsed.perf.placement,
                 tuple(bundled_profile_names()))
    return parsed


def quantity(field: str, value: str) -> Decimal:
    """A Kubernetes quantity ("500m", "64Gi", "1.5G") as a number, or InvalidSpec."""
    try:
        return Decimal(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation):
        raise InvalidSpec(field, f"{value!r} is not a Kubernetes quantity",
                          "Write a number with an optional suffix, e.g. 500m, 8, 16Gi") from None


def check_runtime(runtime: Runtime) -> None:
    """The CRD's CEL rules on spec.runtime, checked here too: the API server of an older
    cluster, a dry run or the emulator may not evaluate them."""
    if runtime.port == runtime.health_port:
        raise InvalidSpec(
            "spec.runtime.healthPort",
            f"{runtime.health_port} is also spec.runtime.port; the pod cannot serve both on it",
            "Give the API (spec.runtime.port) and the health endpoints different ports",
        )
    shm = quantity("spec.runtime.shmSizeLimit", runtime.shm_size_limit)
    if shm <= 0:
        raise InvalidSpec(
            "spec.runtime.shmSizeLimit",
            f"{runtime.shm_size_limit!r} leaves the pipeline's stages no shared memory",
            "Use a positive size, e.g. 16Gi",
        )
    requests = runtime.resources.get("requests") or {}
    limits = runtime.resources.get("limits") or {}
    for resource in ("cpu", "memory"):
        if resource not in requests or resource not in limits:
            continue
        field = f"spec.runtime.resources.limits.{resource}"
        request = quantity(f"spec.runtime.resources.requests.{resource}", requests[resource])
        if quantity(field, limits[resource]) < request:
            raise InvalidSpec(
                field,
                f"{limits[resource]!r} is below requests.{resource} {requests[resource]!r}; "
                "Kubernetes refuses such a pod",
                f"Raise the limit to at least {requests[resource]} or lower the request",
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
        search=parse_search(profile["search"]),
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


def _perf(perf: Mapping[str, Any]) -> Perf:
    gate, job = perf["gate"], perf["job"]
    return Perf(
        enabled=perf["enabled"],
        placement=perf["placement"],
        concurrencies=tuple(perf["concurrencies"]),
        headline_concurrency=perf["headlineConcurrency"],
        dataset_claim=perf.get("datasetClaim"),
        dataset_path=perf["datasetPath"],
        asr_model_claim=perf.get("asrModelClaim"),
        asr_model_path=perf["asrModelPath"],
        rescore_model_path=perf.get("rescoreModelPath"),
        speaker_model_path=perf.get("speakerModelPath"),
        artifacts_claim=perf.get("artifactsClaim"),
        image=perf.get("image"),
        history_limit=perf["historyLimit"],
        rollback=perf["rollback"],
        job=JobPolicy(job["activeDeadlineSeconds"], job["backoffLimit"], job["maxAttempts"]),
        gate=Gate(
            # Without a choice, the gate watches the concurrency the table shows.
            concurrencies=tuple(gate.get("concurrencies") or [perf["headlineConcurrency"]]),
            max_throughput_loss_percent=float(gate["maxThroughputLossPercent"]),
            max_first_audio_p95_rise_percent=float(gate["maxFirstAudioP95RisePercent"]),
            max_wer_percent=float(gate["maxWerPercent"]),
            max_wer_increase_points=float(gate["maxWerIncreasePoints"]),
            max_sim_drop=float(gate["maxSimDrop"]),
            max_mos_drop=float(gate["maxMosDrop"]),
        ),
    )


def check_perf(spec: SpeechSpec) -> None:
    """What the schema cannot say: choices that must agree with each other.

    Checked even while perf is disabled, so enabling it later cannot turn a
    long-accepted spec into a refused one, except for the volumes it then needs.
    """
    perf = spec.perf
    refuse_repeats("spec.perf.concurrencies", perf.concurrencies)
    refuse_repeats("spec.perf.gate.concurrencies", perf.gate.concurrencies)
    if perf.headline_concurrency not in perf.concurrencies:
        raise InvalidSpec(
            "spec.perf.headlineConcurrency",
            f"{perf.headline_concurrency} is not among spec.perf.concurrencies "
            f"{list(perf.concurrencies)}",
            "Add it to spec.perf.concurrencies or pick one of them",
        )
    for i, c in enumerate(perf.gate.concurrencies):
        if c not in perf.concurrencies:
            raise InvalidSpec(
                f"spec.perf.gate.concurrencies[{i}]",
                f"{c} is not measured: spec.perf.concurrencies is {list(perf.concurrencies)}",
                "Gate only concurrencies the sweep runs, or add it to spec.perf.concurrencies",
            )
    if perf.placement == "maintenance" and spec.autoscaling.enabled:
        raise InvalidSpec(
            "spec.perf.placement",
            "maintenance scales serving to zero for the benchmark, but the "
            "HorizontalPodAutoscaler owns the replicas while spec.autoscaling.enabled is true",
            "Use placement dedicated or live, or turn autoscaling off",
        )
    if not perf.enabled:
        return
    for field, value, what in (
        ("datasetClaim", perf.dataset_claim, "the prepared Seed-TTS English subset"),
        ("asrModelClaim", perf.asr_model_claim, "openai/whisper-large-v3"),
    ):
        if value is None:
            raise InvalidSpec(
                f"spec.perf.{field}",
                "is required when spec.perf.enabled is true",
                f"Name the PersistentVolumeClaim holding {what}, or set spec.perf.enabled false",
            )
    if perf.placement == "live" and spec.replicas == 0 and not spec.autoscaling.enabled:
        raise InvalidSpec(
            "spec.perf.placement",
            "live measures the serving Service, but spec.replicas is 0",
            "Serve at least one replica, or use placement dedicated or maintenance",
        )

