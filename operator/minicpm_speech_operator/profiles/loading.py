"""The bundled profiles, and a profile's YAML parsed within the contract's input limits
(:mod:`minicpm_speech_contract.bounded`) by a loader that refuses duplicate keys."""

from __future__ import annotations

from typing import Any

import yaml
from minicpm_speech_contract.bounded import BoundedInputError, load_yaml
from minicpm_speech_contract.describe import type_of

from minicpm_speech_operator.assets import asset_dir

from .validation import ProfileError


def bundled_profile_names() -> list[str]:
    """Names of the profiles shipped with the operator, sorted."""
    return sorted(path.stem for path in asset_dir("profiles").glob("*.yaml") if path.is_file())


def load_bundled_profile(name: str) -> dict[str, Any]:
    """The bundled profile called ``name``, as a mapping (not yet validated)."""
    names = bundled_profile_names()
    if name not in names:
        raise ProfileError(
            "spec.profile.name",
            f"unknown profile {name!r}",
            f"Use one of the bundled profiles ({', '.join(names)}) or a ConfigMap holding "
            "your own profile.",
        )
    text = (asset_dir("profiles") / f"{name}.yaml").read_text(encoding="utf-8")
    return parse_profile_text(text, field=f"spec.profile (bundled profile {name})")


def parse_profile_text(text: str, *, field: str) -> dict[str, Any]:
    """Parse a profile written as YAML (for example a ConfigMap's value).

    Input over the size, depth, node or alias limits is refused before anything expands.
    """
    try:
        doc = load_yaml(text, field=field)
    except BoundedInputError as error:
        raise ProfileError(field, error.message, error.fix) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ProfileError(
            field,
            f"is not valid YAML ({exc.problem}{where})",
            "Fix the YAML at that place, for example its indentation or a missing colon.",
        ) from None
    except yaml.YAMLError as exc:
        raise ProfileError(
            field, f"is not valid YAML ({exc})", "Fix the YAML syntax of the profile."
        ) from None
    if doc is None:
        raise ProfileError(
            field,
            "is empty",
            "Put a profile there: a mapping with stages, platforms and connectors.",
        )
    if not isinstance(doc, dict):
        raise ProfileError(
            field,
            f"must be a mapping of deploy-config keys, got {type_of(doc)}",
            "Write the profile as a mapping with stages, platforms and connectors at the top.",
        )
    return doc
