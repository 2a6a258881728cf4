"""The bundled profiles, and a profile's YAML parsed with a loader that refuses duplicate keys."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

from minicpm_speech_operator.assets import asset_dir

from .validation import ProfileError, _type_of


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


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses a key written twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_profile_text(text: str, *, field: str) -> dict[str, Any]:
    """Parse a profile written as YAML (for example a ConfigMap's value)."""
    try:
        doc = yaml.load(text, Loader=_StrictLoader)
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
            f"must be a mapping of deploy-config keys, got {_type_of(doc)}",
            "Write the profile as a mapping with stages, platforms and connectors at the top.",
        )
    return doc
