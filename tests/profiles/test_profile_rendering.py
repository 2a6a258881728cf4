"""Rendering bundled profiles and overrides into the deploy config the server receives."""

from __future__ import annotations

import copy
import difflib
import hashlib
import os
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from minicpm_speech_operator.profiles import (
    ProfileError,
    RenderedDeployConfig,
    bundled_profile_names,
    load_bundled_profile,
    merge_overrides,
    render_deploy_config,
)
from minicpm_speech_operator.profiles.rendering import GENERATED_HEADER

GOLDEN_DIR = Path(__file__).parent / "golden"
# Where the serving image keeps vLLM-Omni's turn-based deploy config; the rendered
# overlay names it verbatim.
BASE_CONFIG = "/usr/local/lib/python3.12/dist-packages/vllm_omni/deploy/minicpmo_4_5_turn.yaml"
PROFILES = ["default", "high-concurrency", "low-latency"]


def extra(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["connectors"]["connector_of_shared_memory"]["extra"]


def stage(doc: dict[str, Any], stage_id: int, *, cuda: bool = False) -> dict[str, Any]:
    stages = doc["platforms"]["cuda"]["stages"] if cuda else doc["stages"]
    return next(item for item in stages if item["stage_id"] == stage_id)


def shuffled(value: Any, rng: random.Random) -> Any:
    """The same document with every mapping's keys, and every stages list, reordered."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: shuffled(value[key], rng) for key in keys}
    if isinstance(value, list):
        items = [shuffled(item, rng) for item in value]
        if items and all(isinstance(item, dict) and "stage_id" in item for item in items):
            rng.shuffle(items)
        return items
    return value


def render(profile: str, overrides: dict[str, Any] | None = None) -> RenderedDeployConfig:
    return render_deploy_config(
        load_bundled_profile(profile), overrides or {}, base_config=BASE_CONFIG
    )


# --- golden files ----------------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_rendered_profile_matches_golden_file(name: str) -> None:
    """Any change to what the server receives shows up here as a diff to review.

    UPDATE_GOLDEN=1 rewrites the golden files from the current rendering.
    """
    rendered = render(name)
    golden = GOLDEN_DIR / f"{name}.yaml"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(exist_ok=True)
        golden.write_text(rendered.text, encoding="utf-8")
        pytest.skip(f"rewrote {golden}")
    assert golden.is_file(), f"{golden} is missing; run with UPDATE_GOLDEN=1 to create it"
    expected = golden.read_text(encoding="utf-8")
    if rendered.text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                rendered.text.splitlines(keepends=True),
                fromfile=f"golden/{name}.yaml",
                tofile="rendered now",
            )
        )
        pytest.fail(f"rendering of profile {name!r} changed (UPDATE_GOLDEN=1 accepts it):\n{diff}")


def test_every_bundled_profile_has_a_golden_file() -> None:
    assert sorted(path.stem for path in GOLDEN_DIR.glob("*.yaml")) == bundled_profile_names()


# --- what the rendered file looks like -------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_rendered_overlay_names_its_base_first_and_says_it_is_generated(name: str) -> None:
    rendered = render(name)
    first, second, *_ = rendered.text.splitlines()
    assert rendered.text.startswith(GENERATED_HEADER)
    assert first.startswith("# Generated")
    assert second == f"base_config: {BASE_CONFIG}"
    assert rendered.sha256 == hashlib.sha256(rendered.text.encode()).hexdigest()


@pytest.mark.parametrize("name", PROFILES)
def test_rendered_overlay_is_the_profile_plus_base_config(name: str) -> None:
    profile = load_bundled_profile(name)
    document = yaml.safe_load(render(name).text)
    assert next(iter(document)) == "base_config"
    assert document.pop("base_config") == BASE_CONFIG
    assert document == profile
    assert [s["stage_id"] for s in document["stages"]] == [0, 1, 2]


def test_stages_come_out_sorted_by_stage_id_whatever_order_they_were_written_in() -> None:
    profile = load_bundled_profile("default")
    profile["stages"].reverse()
    profile["platforms"]["cuda"]["stages"].reverse()
    text = render_deploy_config(profile, {}, base_config=BASE_CONFIG).text
    document = yaml.safe_load(text)
    assert [s["stage_id"] for s in document["stages"]] == [0, 1, 2]
    assert [s["stage_id"] for s in document["platforms"]["cuda"]["stages"]] == [0, 1]
    assert text == render("default").text


# --- determinism -----------------------------------------------------------------------


@pytest.mark.parametrize("name", PROFILES)
def test_same_input_in_any_key_order_gives_the_same_bytes_and_hash(name: str) -> None:
    profile = load_bundled_profile(name)
    overrides = {
        "stages": [{"max_num_seqs": 2, "stage_id": 2}, {"stage_id": 0, "enforce_eager": False}],
        "connectors": {"connector_of_shared_memory": {"extra": {"reference_cache_size": 8}}},
    }
    reference = render_deploy_config(profile, overrides, base_config=BASE_CONFIG)
    rng = random.Random(1234)
    for _ in range(20):
        again = render_deploy_config(
            shuffled(profile, rng), shuffled(overrides, rng), base_config=BASE_CONFIG
        )
        assert again.text == reference.text
        assert again.sha256 == reference.sha256


def test_a_changed_value_or_base_changes_the_hash() -> None:
    plain = render("default")
    changed = render("default", {"stages": [{"stage_id": 2, "max_num_seqs": 6}]})
    other_base = render_deploy_config(
        load_bundled_profile("default"),
        {},
        base_config="/opt/vllm_omni/deploy/minicpmo_4_5_turn.yaml",
    )
    assert len({plain.sha256, changed.sha256, other_base.sha256}) == 3


def test_rendered_config_is_immutable() -> None:
    rendered = render("default")
    with pytest.raises(AttributeError):
        rendered.text = "changed"  # type: ignore[misc]


def test_base_config_must_be_an_absolute_yaml_path() -> None:
    for bad in ("minicpmo_4_5_turn.yaml", "/opt/vllm_omni/deploy/", "", "/x.yaml\nstages: []"):
        with pytest.raises(ValueError, match="base_config"):
            render_deploy_config(load_bundled_profile("default"), {}, base_config=bad)


# --- merging overrides -----------------------------------------------------------------


def test_stage_override_merges_by_stage_id_and_keeps_every_other_key() -> None:
    profile = load_bundled_profile("default")
    merged = merge_overrides(profile, {"stages": [{"stage_id": 2, "max_num_seqs": 6}]})
    assert stage(merged, 2) == {"stage_id": 2, "max_num_seqs": 6}
    assert stage(merged, 0) == stage(profile, 0)
    assert stage(merged, 1) == stage(profile, 1)
    assert merged["platforms"] == profile["platforms"]
    assert merged["connectors"] == profile["connectors"]


def test_nested_mapping_override_keeps_its_siblings() -> None:
    profile = load_bundled_profile("default")
    merged = merge_overrides(
        profile, {"stages": [{"stage_id": 0, "limit_mm_per_prompt": {"audio": 1}}]}
    )
    assert stage(merged, 0)["limit_mm_per_prompt"] == {"image": 0, "audio": 1, "video": 0}
    assert stage(merged, 0)["max_num_seqs"] == stage(profile, 0)["max_num_seqs"]


def test_connector_extra_override_keeps_the_other_extras() -> None:
    profile = load_bundled_profile("high-concurrency")
    merged = merge_overrides(
        profile, {"connectors": {"connector_of_shared_memory": {"extra": {"cfm_max_graphs": 96}}}}
    )
    assert extra(merged) == {**extra(profile), "cfm_max_graphs": 96}


def test_cuda_kv_override_merges_by_stage_id() -> None:
    profile = load_bundled_profile("default")
    merged = merge_overrides(
        profile,
        {"platforms": {"cuda": {"stages": [{"stage_id": 1, "kv_cache_memory_bytes": 3 << 30}]}}},
    )
    assert stage(merged, 0, cuda=True) == stage(profile, 0, cuda=True)
    assert stage(merged, 1, cuda=True)["kv_cache_memory_bytes"] == 3 << 30


def test_override_adds_a_stage_the_profile_does_not_mention() -> None:
    profile = {"stages": [{"stage_id": 0, "max_num_seqs": 8}]}
    merged = merge_overrides(profile, {"stages": [{"stage_id": 2, "max_num_seqs": 8}]})
    assert sorted(s["stage_id"] for s in merged["stages"]) == [0, 2]


def test_a_list_value_is_replaced_not_appended() -> None:
    profile = load_bundled_profile("default")
    merged = merge_overrides(
        profile,
        {"connectors": {"connector_of_shared_memory": {"extra": {"setup_graph_batch_sizes": [1]}}}},
    )
    assert extra(merged)["setup_graph_batch_sizes"] == [1]


def test_merge_and_render_never_change_their_inputs_or_share_objects_with_them() -> None:
    profile = load_bundled_profile("default")
    overrides = {
        "stages": [{"stage_id": 0, "limit_mm_per_prompt": {"audio": 1}}],
        "connectors": {
            "connector_of_shared_memory": {"extra": {"setup_graph_batch_sizes": [1, 2]}}
        },
    }
    profile_before, overrides_before = copy.deepcopy(profile), copy.deepcopy(overrides)

    merged = merge_overrides(profile, overrides)
    render_deploy_config(profile, overrides, base_config=BASE_CONFIG)
    assert profile == profile_before
    assert overrides == overrides_before

    stage(merged, 0)["limit_mm_per_prompt"]["image"] = 99
    stage(merged, 1)["max_num_seqs"] = 99
    extra(merged)["setup_graph_batch_sizes"].append(4)
    assert profile == profile_before
    assert overrides == overrides_before


def test_rendering_with_overrides_shows_the_override() -> None:
    overrides = {
        "stages": [{"stage_id": 0, "max_num_seqs": 12}],
        "connectors": {"connector_of_shared_memory": {"extra": {"reference_prep_workers": 6}}},
    }
    document = yaml.safe_load(render("default", overrides).text)
    assert stage(document, 0)["max_num_seqs"] == 12
    assert stage(document, 0)["max_model_len"] == 4096
    assert extra(document)["reference_prep_workers"] == 6
    assert extra(document)["micro_batch_size"] == 4


def test_no_overrides_is_the_same_as_empty_overrides() -> None:
    profile = load_bundled_profile("low-latency")
    assert render_deploy_config(profile, None, base_config=BASE_CONFIG) == render("low-latency")


# --- rules across keys -----------------------------------------------------------------


def test_more_talker_streams_than_its_kv_cache_holds_is_refused_at_the_written_key() -> None:
    with pytest.raises(ProfileError) as caught:
        render("default", {"stages": [{"stage_id": 1, "max_num_seqs": 16}]})
    assert caught.value.field == "spec.profileOverrides.stages[stage_id=1].max_num_seqs"
    assert "4294967296" in caught.value.message
    assert "kv_cache_memory_bytes" in caught.value.fix


def test_talker_streams_with_a_matching_kv_cache_are_accepted() -> None:
    render(
        "default",
        {
            "stages": [{"stage_id": 1, "max_num_seqs": 16}],
            "platforms": {"cuda": {"stages": [{"stage_id": 1, "kv_cache_memory_bytes": 4 << 30}]}},
        },
    )


def test_shrinking_the_talker_kv_cache_is_refused_at_that_key() -> None:
    with pytest.raises(ProfileError) as caught:
        render(
            "high-concurrency",
            {
                "platforms": {
                    "cuda": {"stages": [{"stage_id": 1, "kv_cache_memory_bytes": 2 << 30}]}
                }
            },
        )
    assert (
        caught.value.field
        == "spec.profileOverrides.platforms.cuda.stages[stage_id=1].kv_cache_memory_bytes"
    )


def test_setup_graphs_larger_than_the_micro_batch_are_refused() -> None:
    overrides = {
        "connectors": {
            "connector_of_shared_memory": {"extra": {"setup_graph_batch_sizes": [1, 2, 4, 8]}}
        }
    }
    with pytest.raises(ProfileError) as caught:
        render("default", overrides)
    assert caught.value.field == (
        "spec.profileOverrides.connectors.connector_of_shared_memory.extra.setup_graph_batch_sizes"
    )
    assert "micro_batch_size 4" in caught.value.message

    with pytest.raises(ProfileError) as caught:
        render(
            "high-concurrency",
            {"connectors": {"connector_of_shared_memory": {"extra": {"micro_batch_size": 4}}}},
        )
    assert caught.value.field.endswith(".extra.micro_batch_size")


def test_initial_code2wav_batch_below_the_minimum_is_refused() -> None:
    overrides = {
        "connectors": {
            "connector_of_shared_memory": {
                "extra": {"code2wav_min_batch_size": 4, "code2wav_initial_batch_size": 2}
            }
        }
    }
    with pytest.raises(ProfileError) as caught:
        render("default", overrides)
    assert caught.value.field.endswith(".extra.code2wav_initial_batch_size")


def test_scheduler_token_budget_below_max_num_seqs_is_refused() -> None:
    with pytest.raises(ProfileError) as caught:
        render("default", {"stages": [{"stage_id": 0, "max_num_batched_tokens": 4}]})
    assert caught.value.field == "spec.profileOverrides.stages[stage_id=0].max_num_batched_tokens"


def test_a_broken_configmap_profile_is_blamed_on_the_profile_field() -> None:
    field = "spec.profile.configMapRef (ConfigMap voices, key profile.yaml)"
    profile = {
        "stages": [{"stage_id": 1, "max_num_seqs": 32}],
        "platforms": {"cuda": {"stages": [{"stage_id": 1, "kv_cache_memory_bytes": 2 << 30}]}},
    }
    with pytest.raises(ProfileError) as caught:
        render_deploy_config(profile, {}, base_config=BASE_CONFIG, field_profile=field)
    assert caught.value.field == f"{field}.platforms.cuda.stages[stage_id=1].kv_cache_memory_bytes"
