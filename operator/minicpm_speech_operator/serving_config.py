"""The effective serving configuration of a resource and its hash.

The hash names one serving behaviour: the rendered deploy config plus everything else
that changes what the server computes (image, weights, MPS, graph precapture). It
labels every child, rolls the pod when it changes, and keys the benchmark results.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minicpm_speech_contract.extras import EXTRA_PATH
from minicpm_speech_contract.paths import dig

from .errors import InvalidSpec
from .profiles import (
    load_bundled_profile,
    merge_overrides,
    parse_profile_text,
    render_deploy_config,
)
from .spec import SpeechSpec

HASH_LENGTH = 12
PRECAPTURE_KEYS = (*EXTRA_PATH, "cfm_graph_precapture")


@dataclass(frozen=True, slots=True)
class ServingConfig:
    profile_label: str
    deploy_config: str
    config_hash: str


@dataclass(frozen=True, slots=True)
class Profile:
    document: dict[str, Any]
    field: str  # where its problems are reported


def profile_document(spec: SpeechSpec, configmap: Mapping[str, Any] | None) -> Profile:
    """The profile named by the spec; ``configmap`` is the referenced object, if any, as read."""
    ref = spec.profile
    if ref.name is not None:
        return Profile(load_bundled_profile(ref.name), "spec.profile")
    field = "spec.profile.configMapRef"
    if configmap is None:
        raise InvalidSpec(
            field,
            f"ConfigMap {ref.configmap_name!r} does not exist in this namespace",
            "Create it, or point spec.profile.configMapRef.name at an existing ConfigMap",
        )
    data = configmap.get("data") or {}
    if ref.configmap_key not in data:
        raise InvalidSpec(
            f"{field}.key",
            f"ConfigMap {ref.configmap_name!r} has no key {ref.configmap_key!r}",
            f"Add the profile under that key, or set the key to one of: {', '.join(sorted(data))}",
        )
    where = f"{field} (ConfigMap {ref.configmap_name}, key {ref.configmap_key})"
    return Profile(parse_profile_text(data[ref.configmap_key], field=where), where)


def check_token_secret(spec: SpeechSpec, secret: Mapping[str, Any] | None) -> None:
    """The hub-token Secret must exist and hold the key; its value is never read out."""
    token = spec.model.hub_token
    if token is None:
        return
    field = "spec.model.huggingFace.tokenSecretRef"
    if secret is None:
        raise InvalidSpec(
            field, f"Secret {token.name!r} does not exist in this namespace", "Create the Secret"
        )
    if token.key not in (secret.get("data") or {}) and token.key not in (
        secret.get("stringData") or {}
    ):
        raise InvalidSpec(
            f"{field}.key",
            f"Secret {token.name!r} has no key {token.key!r}",
            "Store the hub token under that key, or point tokenSecretRef.key at the key holding it",
        )


def with_precapture_switch(spec: SpeechSpec) -> dict[str, Any]:
    """The overrides, with spec.runtime.graphPrecapture as the one precapture switch.

    The pod's readiness gate and the runtime's graph precapture must agree; a profile's
    own value yields to the spec, and an override that contradicts the spec is refused.
    """
    overrides = dict(spec.profile_overrides)
    asked = dig(overrides, PRECAPTURE_KEYS)
    if asked is not None and asked != spec.runtime.graph_precapture:
        raise InvalidSpec(
            "spec.profileOverrides." + ".".join(PRECAPTURE_KEYS),
            f"{asked!r} contradicts spec.runtime.graphPrecapture "
            f"({spec.runtime.graph_precapture!r})",
            "Remove the override and set spec.runtime.graphPrecapture, the one precapture switch",
        )
    switch: dict[str, Any] = {PRECAPTURE_KEYS[-1]: spec.runtime.graph_precapture}
    for key in reversed(PRECAPTURE_KEYS[:-1]):
        switch = {key: switch}
    return merge_overrides(overrides, switch)


def serving_config(spec: SpeechSpec, profile: Profile) -> ServingConfig:
    rendered = render_deploy_config(
        profile.document, with_precapture_switch(spec),
        base_config=spec.runtime.base_deploy_config, field_profile=profile.field,
    )
    identity = {
        "deployConfig": rendered.text,
        "image": spec.runtime.image,
        "model": [
            spec.model.hub_repo,
            spec.model.hub_revision,
            spec.model.claim_name,
            spec.model.claim_path,
            spec.model.served_model_name,
        ],
        "mps": [spec.runtime.mps_enabled, spec.runtime.mps_active_thread_percentage],
        "graphPrecapture": spec.runtime.graph_precapture,
    }
    canonical = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return ServingConfig(
        profile_label=spec.profile.label,
        deploy_config=rendered.text,
        config_hash=hashlib.sha256(canonical).hexdigest()[:HASH_LENGTH],
    )
