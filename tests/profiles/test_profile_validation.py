"""Bundled profiles, and the refusals a user sees for a bad profile or bad overrides."""

from __future__ import annotations

import json
import pickle
import random
from typing import Any

import jsonschema
import pytest
from minicpm_speech_operator.assets import asset_dir
from minicpm_speech_operator.profiles import (
    ProfileError,
    bundled_profile_names,
    load_bundled_profile,
    parse_profile_text,
    render_deploy_config,
    validate_profile,
)

BASE_CONFIG = "/usr/local/lib/python3.12/dist-packages/vllm_omni/deploy/minicpmo_4_5_turn.yaml"
OVERRIDES = "spec.profileOverrides"
EXTRA = f"{OVERRIDES}.connectors.connector_of_shared_memory.extra"


def extras(**values: Any) -> dict[str, Any]:
    return {"connectors": {"connector_of_shared_memory": {"extra": values}}}


def refusal(overrides: Any, profile: str = "default") -> ProfileError:
    with pytest.raises(ProfileError) as caught:
        render_deploy_config(load_bundled_profile(profile), overrides, base_config=BASE_CONFIG)
    return caught.value


# --- the bundled profiles --------------------------------------------------------------


def test_bundled_profiles_are_listed_by_name_without_the_schema() -> None:
    assert bundled_profile_names() == ["default", "high-concurrency", "low-latency"]


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    schema = json.loads((asset_dir("profiles") / "schema.json").read_text())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("name", ["default", "high-concurrency", "low-latency"])
def test_every_bundled_profile_validates(name: str) -> None:
    validate_profile(load_bundled_profile(name), field="spec.profile")


@pytest.mark.parametrize("name", ["default", "high-concurrency", "low-latency"])
def test_every_bundled_profile_opens_with_a_header_saying_what_it_is_for(name: str) -> None:
    text = (asset_dir("profiles") / f"{name}.yaml").read_text()
    header = text.split("\n\n")[0]
    assert header.startswith(f'# Profile "{name}"')
    for setting in ("max_num_seqs", "kv_cache_memory_bytes", "micro-batch", "CFM", "TF32"):
        assert setting in header, f"{name}.yaml header does not explain {setting}"


@pytest.mark.parametrize("name", ["default", "high-concurrency", "low-latency"])
def test_every_bundled_profile_serves_pure_tts_with_the_published_code2wav_settings(
    name: str,
) -> None:
    profile = load_bundled_profile(name)
    thinker = next(s for s in profile["stages"] if s["stage_id"] == 0)
    extra = profile["connectors"]["connector_of_shared_memory"]["extra"]
    assert thinker["limit_mm_per_prompt"] == {"image": 0, "audio": 0, "video": 0}
    assert (thinker["max_model_len"], thinker["max_num_batched_tokens"]) == (4096, 4096)
    assert extra["batched_code2wav"] is True
    assert extra["cfm_graph_precapture"] is True
    assert extra["token2wav_allow_tf32"] is True
    assert extra["token2wav_float16"] is False
    assert extra["campplus_backend"] == "cuda"


def test_profiles_scale_from_low_latency_to_high_concurrency() -> None:
    def knobs(name: str) -> tuple[int, int, int]:
        profile = load_bundled_profile(name)
        extra = profile["connectors"]["connector_of_shared_memory"]["extra"]
        seqs = next(s for s in profile["stages"] if s["stage_id"] == 2)["max_num_seqs"]
        return extra["micro_batch_size"], seqs, extra["reference_prep_workers"]

    low, default, high = knobs("low-latency"), knobs("default"), knobs("high-concurrency")
    assert low[0] < default[0] < high[0]
    assert low[1] < default[1] < high[1]
    assert low[2] <= default[2] < high[2]


# --- unknown profile and unreadable profiles -------------------------------------------


def test_unknown_profile_is_refused_with_the_names_that_exist() -> None:
    with pytest.raises(ProfileError) as caught:
        load_bundled_profile("fastest")
    error = caught.value
    assert error.field == "spec.profile.name"
    assert "fastest" in error.message
    for name in ("default", "high-concurrency", "low-latency"):
        assert name in error.fix


@pytest.mark.parametrize("name", ["schema", "../profiles/default", "", "default.yaml"])
def test_profile_names_are_only_bundled_names(name: str) -> None:
    with pytest.raises(ProfileError):
        load_bundled_profile(name)


def test_profile_error_reads_field_message_fix() -> None:
    error = ProfileError("spec.profile", "unknown profile 'x'", "Use one of: default.")
    assert str(error) == "spec.profile: unknown profile 'x'. Use one of: default."
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.field, copy.message, copy.fix) == (error.field, error.message, error.fix)


CONFIGMAP = "spec.profile.configMapRef (ConfigMap x, key profile.yaml)"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("stages:\n  - stage_id: 0\n   max_num_seqs: 4\n", "line 3"),
        ("stages: [\n", "not valid YAML"),
        ("- stage_id: 0\n", "got list"),
        ("just text\n", "got string"),
        ("", "empty"),
        ("stages: []\nstages: []\n", "duplicate key 'stages'"),
    ],
)
def test_unreadable_configmap_profile_is_refused_naming_the_configmap(
    text: str, words: str
) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile_text(text, field=CONFIGMAP)
    assert caught.value.field == CONFIGMAP
    assert words in caught.value.message
    assert caught.value.fix.endswith(".")


def test_readable_configmap_profile_parses_to_a_mapping() -> None:
    text = "stages:\n  - stage_id: 2\n    max_num_seqs: 8\n"
    assert parse_profile_text(text, field=CONFIGMAP) == {
        "stages": [{"stage_id": 2, "max_num_seqs": 8}]
    }


# --- unknown keys ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "suggestion"),
    [
        (
            {"stages": [{"stage_id": 2, "max_num_seq": 16}]},
            f"{OVERRIDES}.stages[stage_id=2].max_num_seq",
            "max_num_seqs",
        ),
        (extras(micro_batchsize=8), f"{EXTRA}.micro_batchsize", "micro_batch_size"),
        ({"session_mode": "duplex"}, f"{OVERRIDES}.session_mode", None),
        ({"stage": []}, f"{OVERRIDES}.stage", "stages"),
        (
            {"platforms": {"cuda": {"stages": [{"stage_id": 0, "kv_cache_bytes": 1 << 30}]}}},
            f"{OVERRIDES}.platforms.cuda.stages[stage_id=0].kv_cache_bytes",
            "kv_cache_memory_bytes",
        ),
        ({"platforms": {"rocm": {}}}, f"{OVERRIDES}.platforms.rocm", None),
        (
            {"connectors": {"connector_of_shared_memory": {"name": "MooncakeConnector"}}},
            f"{OVERRIDES}.connectors.connector_of_shared_memory.name",
            None,
        ),
        (
            {"stages": [{"stage_id": 0, "limit_mm_per_prompt": {"audios": 1}}]},
            f"{OVERRIDES}.stages[stage_id=0].limit_mm_per_prompt.audios",
            "audio",
        ),
    ],
)
def test_unknown_key_is_refused_with_its_full_path(
    overrides: dict[str, Any], field: str, suggestion: str | None
) -> None:
    error = refusal(overrides)
    assert error.field == field
    assert error.message == f"unknown key {field.rsplit('.', 1)[1]!r}"
    if suggestion:
        assert f"Rename it to {suggestion!r}" in error.fix
    assert "Remove it" in error.fix or "remove it" in error.fix


def test_base_config_inside_a_profile_is_refused() -> None:
    profile = {"base_config": "/elsewhere.yaml", "stages": []}
    with pytest.raises(ProfileError) as caught:
        render_deploy_config(profile, {}, base_config=BASE_CONFIG)
    assert caught.value.field == "spec.profile.base_config"


# --- wrong types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "expected", "got"),
    [
        (
            {"stages": [{"stage_id": 0, "max_num_seqs": "16"}]},
            f"{OVERRIDES}.stages[stage_id=0].max_num_seqs",
            "integer",
            'string "16"',
        ),
        (
            {"stages": [{"stage_id": 2, "max_num_seqs": 8.0}]},
            f"{OVERRIDES}.stages[stage_id=2].max_num_seqs",
            "integer",
            "number 8.0",
        ),
        (extras(micro_batch_size=True), f"{EXTRA}.micro_batch_size", "integer", "boolean true"),
        (extras(cfm_graph_precapture="yes"), f"{EXTRA}.cfm_graph_precapture", "boolean", "string"),
        (extras(setup_graph_batch_sizes=4), f"{EXTRA}.setup_graph_batch_sizes", "list", "integer"),
        (
            extras(setup_graph_batch_sizes=[1, "2"]),
            f"{EXTRA}.setup_graph_batch_sizes[1]",
            "integer",
            "string",
        ),
        ({"stages": {"stage_id": 0}}, f"{OVERRIDES}.stages", "list", "mapping"),
        ({"stages": [{"stage_id": "1"}]}, f"{OVERRIDES}.stages[0].stage_id", "integer", "string"),
        (
            {"stages": [{"stage_id": 0, "gpu_memory_utilization": "0.5"}]},
            f"{OVERRIDES}.stages[stage_id=0].gpu_memory_utilization",
            "number",
            "string",
        ),
    ],
)
def test_wrong_type_is_refused_with_expected_and_got(
    overrides: dict[str, Any], field: str, expected: str, got: str
) -> None:
    error = refusal(overrides)
    assert error.field == field
    assert f"expected {expected}, got {got}" in error.message
    assert error.fix.startswith("Set it to") or error.fix.startswith("Write it as")


def test_overrides_that_are_not_a_mapping_are_refused() -> None:
    error = refusal([{"stage_id": 0}])
    assert error.field == OVERRIDES
    assert "expected mapping, got list" in error.message


# --- out of range and not allowed ------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "field", "bound", "fix"),
    [
        (extras(micro_batch_size=65), f"{EXTRA}.micro_batch_size", "maximum of 64", "from 1 to 64"),
        (extras(micro_batch_size=0), f"{EXTRA}.micro_batch_size", "minimum of 1", "from 1 to 64"),
        (extras(cfm_max_graphs=257), f"{EXTRA}.cfm_max_graphs", "maximum of 256", "from 1 to 256"),
        (
            extras(reference_prep_workers=-1),
            f"{EXTRA}.reference_prep_workers",
            "minimum of 0",
            "from 0 to 32",
        ),
        (
            extras(reference_cache_size=5000),
            f"{EXTRA}.reference_cache_size",
            "maximum of 4096",
            "from 1 to 4096",
        ),
        (
            {"stages": [{"stage_id": 3, "max_num_seqs": 8}]},
            f"{OVERRIDES}.stages[stage_id=3].stage_id",
            "maximum of 2",
            "from 0 to 2",
        ),
        (
            {"stages": [{"stage_id": 1, "max_model_len": 8192}]},
            f"{OVERRIDES}.stages[stage_id=1].max_model_len",
            "maximum of 4096",
            "at most 4096",
        ),
        (
            {"stages": [{"stage_id": 0, "gpu_memory_utilization": 0}]},
            f"{OVERRIDES}.stages[stage_id=0].gpu_memory_utilization",
            "lower limit of 0",
            "above 0 and at most 1",
        ),
        (
            {"platforms": {"cuda": {"stages": [{"stage_id": 0, "kv_cache_memory_bytes": 1024}]}}},
            f"{OVERRIDES}.platforms.cuda.stages[stage_id=0].kv_cache_memory_bytes",
            "minimum of 268435456",
            "from 268435456 to 137438953472",
        ),
    ],
)
def test_out_of_range_is_refused_with_the_bound(
    overrides: dict[str, Any], field: str, bound: str, fix: str
) -> None:
    error = refusal(overrides)
    assert error.field == field
    assert error.message.startswith("out of range")
    assert bound in error.message
    assert fix in error.fix


def test_talker_context_limit_does_not_apply_to_the_thinker() -> None:
    render_deploy_config(
        load_bundled_profile("default"),
        {"stages": [{"stage_id": 0, "max_model_len": 8192, "max_num_batched_tokens": 8192}]},
        base_config=BASE_CONFIG,
    )


def test_unknown_campplus_backend_is_refused_with_the_choices() -> None:
    error = refusal(extras(campplus_backend="cpu"))
    assert error.field == f"{EXTRA}.campplus_backend"
    assert '"cpu"' in error.message
    assert error.fix == 'Use one of: "cuda", "onnxruntime", "tensorrt".'


@pytest.mark.parametrize(
    ("sizes", "field", "words"),
    [
        ([1, 3], f"{EXTRA}.setup_graph_batch_sizes[1]", "not an allowed value"),
        ([1, 1], f"{EXTRA}.setup_graph_batch_sizes", "more than once"),
        ([], f"{EXTRA}.setup_graph_batch_sizes", "at least 1"),
    ],
)
def test_setup_graph_batch_sizes_must_be_distinct_graph_batches(
    sizes: list[Any], field: str, words: str
) -> None:
    error = refusal(extras(setup_graph_batch_sizes=sizes))
    assert error.field == field
    assert words in error.message


def test_stage_item_without_stage_id_is_refused() -> None:
    error = refusal({"stages": [{"max_num_seqs": 4}]})
    assert error.field == f"{OVERRIDES}.stages[0].stage_id"
    assert "stage_id" in error.fix


def test_stage_written_twice_is_refused_by_position() -> None:
    error = refusal({"stages": [{"stage_id": 1, "max_num_seqs": 4}, {"stage_id": 1}]})
    assert error.field == f"{OVERRIDES}.stages[1].stage_id"
    assert "more than once" in error.message


# --- which problem is reported ---------------------------------------------------------


def test_first_problem_by_path_is_reported_whatever_the_key_order() -> None:
    overrides = {
        "stages": [
            {"stage_id": 2, "max_num_seqs": 0},
            {"stage_id": 0, "max_num_seqs": "many", "typo": 1},
        ],
        "connectors": {"connector_of_shared_memory": {"extra": {"micro_batch_size": 99}}},
    }
    first = refusal(overrides)
    assert first.field == f"{EXTRA}.micro_batch_size"
    rng = random.Random(7)
    for _ in range(10):
        keys = list(overrides)
        rng.shuffle(keys)
        again = refusal({key: overrides[key] for key in keys})
        assert str(again) == str(first)


def test_problems_in_the_profile_are_named_under_the_profile_field() -> None:
    field = "spec.profile.configMapRef (ConfigMap x, key profile.yaml)"
    profile = {"stages": [{"stage_id": 2, "max_num_seqs": "8"}]}
    with pytest.raises(ProfileError) as caught:
        render_deploy_config(profile, {}, base_config=BASE_CONFIG, field_profile=field)
    assert caught.value.field == f"{field}.stages[stage_id=2].max_num_seqs"


def test_custom_overrides_field_prefix_is_used() -> None:
    with pytest.raises(ProfileError) as caught:
        render_deploy_config(
            load_bundled_profile("default"),
            {"stages": [{"stage_id": 0, "oops": 1}]},
            base_config=BASE_CONFIG,
            field_overrides="spec.perf.arms[1].profileOverrides",
        )
    assert caught.value.field == "spec.perf.arms[1].profileOverrides.stages[stage_id=0].oops"


def test_partial_overrides_validate_on_their_own() -> None:
    validate_profile({}, field=OVERRIDES)
    validate_profile({"stages": [{"stage_id": 1}]}, field=OVERRIDES)
    validate_profile(extras(token2wav_n_timesteps=8), field=OVERRIDES)
