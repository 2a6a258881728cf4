"""Profiles and overrides over the input limits are InvalidSpec, never a RecursionError."""

from __future__ import annotations

from typing import Any

import pytest
from minicpm_speech_operator.errors import InvalidSpec
from minicpm_speech_operator.profiles import ProfileError, parse_profile_text, validate_profile
from minicpm_speech_operator.spec import parse_spec

from tests.e2e.journey import example_spec

FIELD = "spec.profile.configMapRef (ConfigMap x, key profile.yaml)"


def nested(depth: int) -> dict[str, Any]:
    top: dict[str, Any] = {}
    node = top
    for _ in range(depth):
        node["stages"] = {}
        node = node["stages"]
    return top


def test_a_500_deep_document_is_invalid_spec_not_a_recursion_error() -> None:
    with pytest.raises(ProfileError) as caught:
        validate_profile(nested(500), field="spec.profileOverrides")
    assert isinstance(caught.value, InvalidSpec)
    assert caught.value.field == "spec.profileOverrides.stages"
    assert "max_depth" in caught.value.message


def test_500_deep_overrides_in_a_spec_are_invalid_spec() -> None:
    with pytest.raises(InvalidSpec) as caught:
        parse_spec({**example_spec(), "profileOverrides": nested(500)})
    assert caught.value.field == "spec.profileOverrides" and "max_depth" in str(caught.value)


@pytest.mark.parametrize(("text", "limit"), [
    ("stages: " + "[" * 500 + "]" * 500 + "\n", "max_depth"),
    ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                   strict=True))
     + "stages: *i\n", "max_aliases"),
])
def test_a_hostile_configmap_profile_names_the_field_and_the_limit(text: str, limit: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile_text(text, field=FIELD)
    assert caught.value.field == FIELD and limit in caught.value.message
