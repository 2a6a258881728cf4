"""The bounded reader refuses hostile YAML and JSON before anything expands or recurses."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
import yaml
from minicpm_speech_contract.bounded import (
    DEFAULT_LIMITS,
    MESSAGE_LIMIT,
    BoundedInputError,
    Limits,
    check_parsed,
    load_json,
    load_yaml,
    load_yaml_all,
)

FIELD = "spec.profile.configMapRef"
PAYLOAD = "SECRETPAYLOAD"


def billion_laughs() -> str:
    lines = [f'a: &a ["{PAYLOAD}", "{PAYLOAD}", "{PAYLOAD}", "{PAYLOAD}", "{PAYLOAD}"]']
    for level in range(1, 10):
        name, below = chr(ord("a") + level), chr(ord("a") + level - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{below}'] * 9)}]")
    return "\n".join(lines) + "\n"


def few_alias_bomb() -> str:
    """Eight aliases, within the alias limit, each standing for 2,000 values."""
    block = ", ".join([f'"{PAYLOAD}"'] * 2000)
    return f"base: &b [{block}]\n" + "".join(f"c{i}: *b\n" for i in range(8))


def doubling_bomb(levels: int) -> str:
    lines = [f"l0: &l0 [{PAYLOAD}, {PAYLOAD}]"]
    lines += [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def nested(depth: int) -> str:
    return "x: " + "[" * depth + PAYLOAD + "]" * depth + "\n"


def refusal(text: str, limits: Limits = DEFAULT_LIMITS) -> BoundedInputError:
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(BoundedInputError) as caught:
            load_yaml(text, field=FIELD, limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 5
    assert peak < 50 * 2**20, f"{peak} bytes allocated before the refusal"
    return caught.value


def assert_well_formed(error: BoundedInputError, limit_name: str, value: int) -> None:
    text = str(error)
    assert error.field == FIELD or error.field.startswith(FIELD)
    assert limit_name in error.message and str(value) in error.message
    assert error.fix
    assert len(text) <= MESSAGE_LIMIT
    assert PAYLOAD not in text
    assert isinstance(error, ValueError)


def test_billion_laughs_is_refused_before_it_expands() -> None:
    assert_well_formed(refusal(billion_laughs()), "max_aliases", DEFAULT_LIMITS.max_aliases)


def test_an_alias_bomb_within_the_alias_limit_is_refused_by_its_expanded_size() -> None:
    error = refusal(few_alias_bomb())
    assert_well_formed(error, "max_nodes", DEFAULT_LIMITS.max_nodes)


def test_a_doubling_bomb_is_refused_by_whichever_limit_it_reaches_first() -> None:
    # 14 aliases double 2 values up to 2**16 by level 15: the node limit stops it.
    error = refusal(doubling_bomb(15), Limits(max_aliases=100))
    assert_well_formed(error, "max_nodes", DEFAULT_LIMITS.max_nodes)
    # The same shape through aliases nests too: depth counts what an alias stands for.
    error = refusal(doubling_bomb(40), Limits(max_aliases=1000, max_nodes=10**15))
    assert_well_formed(error, "max_depth", DEFAULT_LIMITS.max_depth)


@pytest.mark.parametrize("depth", [33, 500, 100_000])
def test_deep_nesting_is_refused_without_recursion(depth: int) -> None:
    assert_well_formed(refusal(nested(depth)), "max_depth", DEFAULT_LIMITS.max_depth)


def test_nesting_up_to_the_limit_is_read() -> None:
    # The top-level mapping is one level, the lists under x the other 31.
    assert load_yaml(nested(31), field=FIELD)["x"] is not None


def test_a_huge_string_is_refused_by_size() -> None:
    text = "x: " + PAYLOAD * (DEFAULT_LIMITS.max_bytes // len(PAYLOAD) + 1) + "\n"
    assert_well_formed(refusal(text), "max_bytes", DEFAULT_LIMITS.max_bytes)


def test_too_many_nodes_are_refused() -> None:
    text = "".join(f"k{i}: {i}\n" for i in range(DEFAULT_LIMITS.max_nodes))
    assert_well_formed(refusal(text), "max_nodes", DEFAULT_LIMITS.max_nodes)


def test_a_duplicate_key_is_refused() -> None:
    with pytest.raises(yaml.YAMLError, match="duplicate key 'stages'"):
        load_yaml("stages: []\nstages: []\n", field=FIELD)


def test_a_few_aliases_still_work() -> None:
    doc = load_yaml("base: &b {max_num_seqs: 4}\none: *b\ntwo: *b\n", field=FIELD)
    assert doc["one"] == doc["two"] == {"max_num_seqs": 4}


def test_ordinary_documents_read_as_before() -> None:
    text = "stages:\n  - stage_id: 0\n    max_num_seqs: 4\n"
    assert load_yaml(text, field=FIELD) == yaml.safe_load(text)
    assert load_yaml_all("a: 1\n---\nb: 2\n", field=FIELD) == [{"a": 1}, {"b": 2}]
    assert load_json('{"a": ["[{", {"b": 1}]}', field=FIELD) == {"a": ["[{", {"b": 1}]}


def test_the_limits_apply_to_a_whole_stream() -> None:
    text = "---\n".join("".join(f"k{i}: {i}\n" for i in range(4000)) for _ in range(3))
    with pytest.raises(BoundedInputError, match="max_nodes"):
        load_yaml_all(text, field=FIELD)


def test_json_depth_is_refused_without_recursion() -> None:
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(BoundedInputError) as caught:
        load_json(text, field=FIELD)
    assert_well_formed(caught.value, "max_depth", DEFAULT_LIMITS.max_depth)
    big = json.dumps({"x": PAYLOAD * 30_000})
    with pytest.raises(BoundedInputError) as caught:
        load_json(big, field=FIELD)
    assert_well_formed(caught.value, "max_bytes", DEFAULT_LIMITS.max_bytes)


def test_a_parsed_object_is_measured_iteratively_naming_the_top_level_key() -> None:
    deep: dict[str, object] = {}
    node = deep
    for _ in range(5000):  # deeper than the recursion limit
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    with pytest.raises(BoundedInputError) as caught:
        check_parsed({"replicas": 1, "profileOverrides": deep}, field="spec")
    assert caught.value.field == "spec.profileOverrides"
    assert "max_depth" in caught.value.message
    with pytest.raises(BoundedInputError, match="max_bytes") as caught:
        check_parsed({"profileOverrides": {"x": PAYLOAD * 200_000}}, field="spec")
    assert PAYLOAD not in str(caught.value) and len(str(caught.value)) <= MESSAGE_LIMIT
    shared: list[object] = [1] * 10
    for _ in range(8):  # 10**8 places, 90 objects: a shared object counts per place
        shared = [shared] * 10
    with pytest.raises(BoundedInputError, match="max_nodes"):
        check_parsed(shared, field="spec")
    check_parsed({"stages": [{"stage_id": 0, "max_num_seqs": 4}]}, field="spec")


def test_limits_are_frozen_with_documented_defaults() -> None:
    assert Limits(max_bytes=256 * 1024, max_depth=32, max_nodes=10_000,
                                    max_aliases=16) == DEFAULT_LIMITS
    with pytest.raises(AttributeError):
        DEFAULT_LIMITS.max_depth = 1000  # type: ignore[misc]
