"""Check a MiniCPMSpeech manifest the way the API server would, without a cluster.

The API server first applies the schema's defaults, then validates (type, required,
oneOf, pattern, enum, minimum/maximum, ...). kubectl asks for strict field validation,
so an unknown field is an error rather than silently pruned; only a subtree marked
x-kubernetes-preserve-unknown-fields takes any field. The x-kubernetes-* markers
themselves are not JSON Schema and are dropped.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema

from tests.chart.rendering import load_crd

Schema = dict[str, Any]


def openapi_schema(version: str = "v1alpha1") -> Schema:
    """The CRD's openAPIV3Schema for one served version, as written."""
    for served in load_crd()["spec"]["versions"]:
        if served["name"] == version:
            schema: Schema = served["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(version)


def to_json_schema(schema: Schema) -> Schema:
    """The same schema as plain JSON Schema, unknown fields refused as in strict mode."""
    out: Schema = {}
    for key, value in schema.items():
        if key.startswith("x-kubernetes-"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in ("oneOf", "anyOf", "allOf"):
            out[key] = [to_json_schema(branch) for branch in value]
        elif key == "not":
            out[key] = to_json_schema(value)
        else:
            out[key] = copy.deepcopy(value)
    preserves = schema.get("x-kubernetes-preserve-unknown-fields", False)
    if schema.get("type") == "object" and "properties" in schema and not preserves:
        out.setdefault("additionalProperties", False)
    return out


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """Fill missing fields from `default`, top-down, as structural defaulting does."""
    if isinstance(obj, dict):
        for name, child in schema.get("properties", {}).items():
            if name not in obj and "default" in child:
                obj[name] = copy.deepcopy(child["default"])
            if name in obj:
                obj[name] = apply_defaults(child, obj[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in obj.keys() - schema.get("properties", {}).keys():
                obj[name] = apply_defaults(extra, obj[name])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        obj = [apply_defaults(schema["items"], item) for item in obj]
    return obj


def validation_errors(manifest: dict[str, Any]) -> list[str]:
    """Every reason the API server would refuse the manifest; empty when it is accepted."""
    schema = openapi_schema()
    defaulted = apply_defaults(schema, copy.deepcopy(manifest))
    validator = jsonschema.Draft4Validator(to_json_schema(schema))
    return [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in sorted(validator.iter_errors(defaulted), key=lambda e: list(e.path))
    ]
