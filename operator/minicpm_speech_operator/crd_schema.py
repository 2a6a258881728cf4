"""The CRD's own openAPIV3Schema, applied the way the API server applies it.

The emulator, a dry run and an old API server with lax field validation all accept
manifests a real API server would refuse or default. Reading the schema from the one
CRD file and applying its defaults and checks here means the operator judges a
manifest identically wherever it runs.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema
import yaml

from .assets import crd_path
from .errors import InvalidSpec
from .names import NAME_FIX, name_problem

Schema = Mapping[str, Any]


@functools.cache
def crd() -> dict[str, Any]:
    with crd_path().open(encoding="utf-8") as handle:
        document: dict[str, Any] = yaml.safe_load(handle)
    return document


def version_schema(version: str = "v1alpha1") -> dict[str, Any]:
    for entry in crd()["spec"]["versions"]:
        if entry["name"] == version:
            schema: dict[str, Any] = entry["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(f"the CRD serves no version {version!r}")


def spec_schema() -> dict[str, Any]:
    spec: dict[str, Any] = version_schema()["properties"]["spec"]
    return spec


def with_defaults(schema: Schema, value: Any) -> Any:
    """A copy of ``value`` with the schema's defaults filled in, recursively, as on read."""
    value = copy.deepcopy(value)
    _fill_defaults(schema, value)
    return value


def _fill_defaults(schema: Schema, value: Any) -> None:
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for key, child in properties.items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                _fill_defaults(child, value[key])
        if isinstance(schema.get("additionalProperties"), Mapping):
            for key in value.keys() - properties.keys():
                _fill_defaults(schema["additionalProperties"], value[key])
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            _fill_defaults(schema["items"], item)


def strict_json_schema(schema: Schema) -> dict[str, Any]:
    """The schema as plain JSON Schema; unknown fields are errors, as under kubectl's
    default strict field validation, except below x-kubernetes-preserve-unknown-fields."""
    strict: dict[str, Any] = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-"):
            continue
        if key == "properties":
            strict[key] = {name: strict_json_schema(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, Mapping):
            strict[key] = strict_json_schema(value)
        elif key in ("oneOf", "anyOf", "allOf"):
            strict[key] = [strict_json_schema(branch) for branch in value]
        else:
            strict[key] = copy.deepcopy(value)
    preserves = schema.get("x-kubernetes-preserve-unknown-fields", False)
    if schema.get("type") == "object" and "properties" in schema and not preserves:
        strict.setdefault("additionalProperties", False)
    return strict


@functools.cache
def _validator(part: str) -> Any:
    schema = version_schema() if part == "object" else spec_schema()
    return jsonschema.Draft4Validator(strict_json_schema(schema))


def manifest_errors(manifest: Mapping[str, Any]) -> list[InvalidSpec]:
    """Every reason the API server would refuse this whole manifest, after defaulting."""
    defaulted = with_defaults(version_schema(), manifest)
    errors = sorted(_validator("object").iter_errors(defaulted), key=_error_sort_key)
    explained = [_explain(error, "") for error in errors]
    name = (manifest.get("metadata") or {}).get("name")
    # the CRD's CEL rule on the name, which JSON Schema cannot say
    if isinstance(name, str) and (problem := name_problem(name)) is not None:
        explained.insert(0, InvalidSpec("metadata.name", problem, NAME_FIX))
    return explained


def validate_spec(spec: Any, *, prefix: str = "spec") -> None:
    """Raise InvalidSpec for the first (by path) violation of the CRD schema."""
    errors = sorted(_validator("spec").iter_errors(spec), key=_error_sort_key)
    if errors:
        raise _explain(errors[0], prefix)


def _error_sort_key(error: jsonschema.ValidationError) -> tuple[str, str]:
    return (_render_path(error.absolute_path, ""), str(error.validator))


def _render_path(path: Iterable[Any], prefix: str) -> str:
    rendered = prefix
    for part in path:
        rendered += f"[{part}]" if isinstance(part, int) else (f".{part}" if rendered else part)
    return rendered


def _explain(error: jsonschema.ValidationError, prefix: str) -> InvalidSpec:
    field = _render_path(error.absolute_path, prefix)
    kind, detail, instance = error.validator, error.validator_value, error.instance
    description = error.schema.get("description") if isinstance(error.schema, Mapping) else None
    hint = f" ({description})" if description else ""
    if kind == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(instance) - set(known))
        return InvalidSpec(
            f"{field}.{unknown[0]}" if unknown else field,
            "unknown field",
            f"Remove it or fix its spelling; fields allowed here: {', '.join(known)}",
        )
    if kind == "required":
        missing = next(name for name in detail if name not in instance)
        return InvalidSpec(f"{field}.{missing}", "is required", f"Set {field}.{missing}{hint}")
    if kind == "oneOf":
        choices = [name for option in detail for name in option.get("required", [])]
        return InvalidSpec(
            field,
            f"must set exactly one of {', '.join(choices)}",
            f"Keep one of {' or '.join(choices)} under {field}{hint}",
        )
    if kind == "type":
        return InvalidSpec(
            field,
            f"must be of type {detail}, not {type(instance).__name__} {instance!r}",
            f"Give {field} a value of type {detail}{hint}",
        )
    if kind == "enum":
        allowed = ", ".join(map(str, detail))
        return InvalidSpec(field, f"{instance!r} is not allowed", f"Use one of: {allowed}")
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        bound = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
        return InvalidSpec(
            field, f"{instance!r} is out of range", f"Use a value {bound[kind]} {detail}{hint}"
        )
    if kind == "pattern":
        # A long pattern would crowd out the description that says the same in words.
        fix = f"Match the pattern {detail}{hint}" if len(detail) <= 80 or not hint else (
            f"Write it in the form the field describes{hint}")
        return InvalidSpec(field, f"{instance!r} has the wrong format", fix)
    return InvalidSpec(field, error.message, f"Fix {field}{hint}")
