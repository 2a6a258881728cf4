"""Profile resolution, referenced objects and the config hash."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from minicpm_speech_operator.errors import InvalidSpec
from minicpm_speech_operator.serving_config import (
    check_token_secret,
    profile_document,
    serving_config,
)
from minicpm_speech_operator.spec import parse_spec

from .builders import claim_spec


def parsed(**changes: Any) -> Any:
    return parse_spec({**claim_spec(), **changes})


def rendered(spec: Any, configmap: dict[str, Any] | None = None) -> Any:
    return serving_config(spec, profile_document(spec, configmap))


def refusal(call: Any) -> InvalidSpec:
    with pytest.raises(InvalidSpec) as caught:
        call()
    return caught.value


def test_overlay_names_vllm_omni_base_inside_the_image() -> None:
    spec = parsed()
    text = rendered(spec).deploy_config
    assert yaml.safe_load(text)["base_config"] == spec.runtime.base_deploy_config


def test_unknown_bundled_profile_lists_the_real_ones() -> None:
    error = refusal(lambda: rendered(parsed(profile={"name": "turbo"})))
    assert error.field == "spec.profile.name"
    assert "high-concurrency" in error.fix and "low-latency" in error.fix


def test_mistyped_override_is_named_with_its_full_path() -> None:
    spec = parsed(profileOverrides={"stages": [{"stage_id": 2, "max_num_seq": 4}]})
    error = refusal(lambda: rendered(spec))
    assert error.field == "spec.profileOverrides.stages[stage_id=2].max_num_seq"


def test_wrong_type_override_is_refused() -> None:
    extra = {"micro_batch_size": "eight"}
    spec = parsed(profileOverrides={"connectors": {"connector_of_shared_memory": {"extra": extra}}})
    error = refusal(lambda: rendered(spec))
    assert error.field.endswith("extra.micro_batch_size")


def test_configmap_profile_missing_key_and_malformed_are_refused() -> None:
    spec = parsed(profile={"configMapRef": {"name": "mine"}})
    assert refusal(lambda: rendered(spec, None)).field == "spec.profile.configMapRef"
    missing_key = {"data": {"other.yaml": "stages: []"}}
    assert refusal(lambda: rendered(spec, missing_key)).field == "spec.profile.configMapRef.key"
    malformed = {"data": {"profile.yaml": "stages: [\n"}}
    assert refusal(lambda: rendered(spec, malformed)).field.startswith(
        "spec.profile.configMapRef (ConfigMap mine, key profile.yaml)")


def test_configmap_profile_renders_like_the_bundled_file() -> None:
    default = profile_document(parsed(), None).document
    own = parsed(profile={"configMapRef": {"name": "mine"}})
    cfg = rendered(own, {"data": {"profile.yaml": yaml.safe_dump(default)}})
    assert cfg.profile_label == "configmap/mine"
    assert cfg.deploy_config == rendered(parsed()).deploy_config


def test_token_secret_must_exist_and_hold_the_key() -> None:
    spec = parse_spec({"model": {"huggingFace": {
        "repo": "a/b", "revision": "1" * 40, "tokenSecretRef": {"name": "hf", "key": "tok"}}}})
    assert refusal(lambda: check_token_secret(spec, None)).field.endswith("tokenSecretRef")
    wrong = {"data": {"token": "c2VjcmV0"}}
    error = refusal(lambda: check_token_secret(spec, wrong))
    assert error.field.endswith("tokenSecretRef.key") and "c2VjcmV0" not in str(error)
    check_token_secret(spec, {"data": {"tok": "c2VjcmV0"}})


def test_graph_precapture_is_one_switch() -> None:
    off = parsed(runtime={"graphPrecapture": False})
    extra = yaml.safe_load(rendered(off).deploy_config)["connectors"][
        "connector_of_shared_memory"]["extra"]
    assert extra["cfm_graph_precapture"] is False
    contradiction = parsed(profileOverrides={"connectors": {"connector_of_shared_memory": {
        "extra": {"cfm_graph_precapture": False}}}})
    assert "graphPrecapture" in refusal(lambda: rendered(contradiction)).message


def test_hash_follows_what_changes_serving_and_only_that() -> None:
    base = rendered(parsed()).config_hash
    assert rendered(parsed()).config_hash == base
    assert rendered(parsed(runtime={"image": "example.com/rt:2"})).config_hash != base
    assert rendered(parsed(profile={"name": "low-latency"})).config_hash != base
    overrides = {"stages": [{"stage_id": 1, "max_num_seqs": 4}]}
    assert rendered(parsed(profileOverrides=overrides)).config_hash != base
    assert rendered(parsed(runtime={"mps": {"enabled": False}})).config_hash != base
    # New weights: another folder on the claim, another claim, or a Hub revision.
    for model in ({"pvc": {"claimName": "weights", "path": "MiniCPM-o-4_5-v2"}},
                  {"pvc": {"claimName": "weights-v2", "path": "MiniCPM-o-4_5"}}):
        assert rendered(parsed(model=model)).config_hash != base, model
    hub = {"huggingFace": {"repo": "openbmb/MiniCPM-o-4_5", "revision": "1" * 40}}
    newer = {"huggingFace": {"repo": "openbmb/MiniCPM-o-4_5", "revision": "2" * 40}}
    assert rendered(parsed(model=hub)).config_hash != rendered(parsed(model=newer)).config_hash
    # Placement is not serving behaviour: the pod moves, the hash stays.
    assert rendered(parsed(runtime={"nodeSelector": {"a": "b"}})).config_hash == base


@pytest.mark.parametrize("extra", [
    {"token2wav_precision": "bf16-cache"},
    {"token2wav_precision": "bf16"},
    {"token2wav_n_timesteps": 5},
])
def test_precision_and_solver_steps_are_part_of_the_config_hash(extra: dict[str, Any]) -> None:
    """A precision or step-count change is a new serving behaviour: a new hash runs the
    benchmark and the quality gate against the last good configuration."""
    base = rendered(parsed())
    changed = rendered(parsed(
        profileOverrides={"connectors": {"connector_of_shared_memory": {"extra": extra}}}))
    assert changed.config_hash != base.config_hash
    key, value = next(iter(extra.items()))
    assert f"{key}: {value}" in changed.deploy_config


def test_a_precision_the_contract_lacks_is_refused_by_name() -> None:
    extra = {"token2wav_precision": "fp8"}
    spec = parsed(profileOverrides={"connectors": {"connector_of_shared_memory": {"extra": extra}}})
    error = refusal(lambda: rendered(spec))
    assert error.field.endswith("extra.token2wav_precision")
    assert "bf16" in str(error)
