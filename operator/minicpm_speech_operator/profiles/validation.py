"""Schema validation: a profile or overrides against ``profiles/schema.json``, and the first
problem explained with the full path a user would write and a one-sentence fix.

Paths are rendered as a user writes them: stage list items as ``[stage_id=N]``.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jsonschema
from jsonschema.exceptions import ValidationError
from minicpm_speech_contract import extras as extras_contract
from minicpm_speech_contract.bounded import BoundedInputError, check_parsed
from minicpm_speech_contract.describe import show, type_of

from minicpm_speech_operator.assets import asset_dir
from minicpm_speech_operator.errors import InvalidSpec

SCHEMA_FILE = "schema.json"

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_TYPE_WORDS = {"object": "mapping", "array": "list"}  # JSON Schema words, as YAML says them


class ProfileError(InvalidSpec):
    """A profile or its overrides is refused: which field, what is wrong, what to do."""


class _StageRef(NamedTuple):
    """A path step selecting the item of a stages list by its stage_id."""

    stage_id: int


_PathStep = str | int | _StageRef


@functools.lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads((asset_dir("profiles") / SCHEMA_FILE).read_text(encoding="utf-8"))
    # The contract owns the extras; the file's copy is for people reading the schema.
    schema["$defs"]["code2wavExtra"] = extras_contract.json_schema()
    base = jsonschema.Draft202012Validator
    base.check_schema(schema)
    # A YAML integer only: neither a boolean nor a float such as 8.0.
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return jsonschema.validators.extend(base, type_checker=checker)(schema)


def validate_profile(doc: dict[str, Any], *, field: str) -> None:
    """Check a profile, or a user's partial overrides, against ``profiles/schema.json``.

    The first problem, in path order, is raised as a :class:`ProfileError` naming
    ``field`` plus the path into ``doc``. A document over the contract's input limits
    (depth, size, nodes) is refused first, so neither jsonschema's recursive walk nor an error
    message quoting the document can run away.
    """
    try:
        check_parsed(doc, field=field)
    except BoundedInputError as error:
        raise ProfileError(error.field, error.message, error.fix) from None
    errors = sorted(_validator().iter_errors(doc), key=_error_order)
    if errors:
        raise _explain(errors[0], doc, field)
    for list_path in (("stages",), ("platforms", "cuda", "stages")):
        items = _get(doc, list_path)
        seen: set[int] = set()
        for index, item in enumerate(items if isinstance(items, list) else []):
            stage_id = item["stage_id"]
            if stage_id in seen:
                raise ProfileError(
                    f"{field}{_render_path(doc, list_path)}[{index}].stage_id",
                    f"stage_id {stage_id} appears more than once in this list",
                    f"Merge the entries for stage {stage_id} into one.",
                )
            seen.add(stage_id)


def _error_order(error: ValidationError) -> tuple[Any, ...]:
    path = tuple(
        (0, step, "") if isinstance(step, int) else (1, 0, str(step))
        for step in error.absolute_path
    )
    # At one path, a wrong type is the most useful thing to report.
    return (path, error.validator != "type", str(error.validator), error.message)


def _explain(error: ValidationError, doc: Any, field: str) -> ProfileError:
    path: list[_PathStep] = list(error.absolute_path)
    kind = error.validator
    schema = error.schema if isinstance(error.schema, Mapping) else {}
    value = error.instance

    if kind == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        key = sorted((k for k in value if k not in allowed), key=str)[0]
        guess = difflib.get_close_matches(str(key), allowed, n=1)
        fix = f"Rename it to {guess[0]!r} or remove it" if guess else "Remove it"
        if key == "base_config":
            fix = "Remove it, since the operator points base_config at the serving image's base"
        return ProfileError(
            field + _render_path(doc, (*path, key)),
            f"unknown key {key!r}",
            f"{fix}; the keys allowed here are: {', '.join(allowed)}.",
        )
    if kind == "required":
        missing = next(k for k in error.validator_value if k not in value)
        fix = (
            "Add stage_id: 0 (Thinker), 1 (Talker) or 2 (Code2Wav) to say which stage it changes."
            if missing == "stage_id"
            else f"Add {missing}."
        )
        return ProfileError(
            field + _render_path(doc, (*path, missing)), f"missing required key {missing!r}", fix
        )

    where = field + _render_path(doc, path)
    if kind == "type":
        expected = _TYPE_WORDS.get(str(error.validator_value), str(error.validator_value))
        shown = f" {show(value)}" if not isinstance(value, dict | list) else ""
        return ProfileError(
            where,
            f"wrong type: expected {expected}, got {type_of(value)}{shown}",
            _type_fix(expected, schema),
        )
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        relation = {
            "minimum": "below the minimum of",
            "maximum": "above the maximum of",
            "exclusiveMinimum": "not above the lower limit of",
            "exclusiveMaximum": "not below the upper limit of",
        }[kind]
        return ProfileError(
            where,
            f"out of range: {show(value)} is {relation} {show(error.validator_value)}",
            f"Set it to a value {_range_words(schema)}.",
        )
    if kind == "enum":
        options = ", ".join(show(option) for option in error.validator_value)
        return ProfileError(
            where, f"{show(value)} is not an allowed value", f"Use one of: {options}."
        )
    if kind == "uniqueItems":
        return ProfileError(where, "lists a value more than once", "List each value once.")
    if kind in ("minItems", "maxItems"):
        bound = "at least" if kind == "minItems" else "at most"
        return ProfileError(
            where,
            f"has {len(value)} items, {bound} {error.validator_value} allowed",
            f"Give it {bound} {error.validator_value} items.",
        )
    return ProfileError(where, error.message, f"Change it to match profiles/{SCHEMA_FILE}.")


def _type_fix(expected: str, schema: Mapping[str, Any]) -> str:
    if expected == "integer":
        return f"Set it to a whole number {_range_words(schema)}, without quotes."
    if expected == "number":
        return f"Set it to a number {_range_words(schema)}, without quotes."
    if expected == "boolean":
        return "Set it to true or false, without quotes."
    if expected == "string" and "enum" in schema:
        return f"Set it to one of: {', '.join(show(o) for o in schema['enum'])}."
    if expected == "mapping":
        return "Write it as a mapping of keys to values."
    if expected == "list":
        return "Write it as a list."
    return f"Set it to a {expected}."


def _range_words(schema: Mapping[str, Any]) -> str:
    low = schema.get("minimum")
    high = schema.get("maximum")
    above = schema.get("exclusiveMinimum")
    if low is not None and high is not None:
        return f"from {show(low)} to {show(high)}"
    if above is not None and high is not None:
        return f"above {show(above)} and at most {show(high)}"
    if high is not None:
        return f"of at most {show(high)}"
    if low is not None:
        return f"of at least {show(low)}"
    if above is not None:
        return f"above {show(above)}"
    return "in range"


# --- paths ---------------------------------------------------------------------------


def _is_stage_list(path: Sequence[Any]) -> bool:
    return tuple(path) == ("stages",) or (
        len(path) == 3 and path[0] == "platforms" and path[2] == "stages"
    )


def _render_path(doc: Any, path: Sequence[_PathStep]) -> str:
    """``path`` as a user writes it, with stage list items shown as ``[stage_id=N]``."""
    out = ""
    node = doc
    walked: list[_PathStep] = []
    for step in path:
        if isinstance(step, _StageRef):
            out += f"[stage_id={step.stage_id}]"
            node = _find_stage(node, step.stage_id)
        elif isinstance(step, int):
            item = node[step] if isinstance(node, list) and 0 <= step < len(node) else None
            stage_id = item.get("stage_id") if isinstance(item, dict) else None
            if _is_stage_list(walked) and type(stage_id) is int:
                out += f"[stage_id={stage_id}]"
            else:
                out += f"[{step}]"
            node = item
        else:
            out += f".{step}" if _IDENTIFIER.match(str(step)) else f"[{show(str(step))}]"
            node = node.get(step) if isinstance(node, dict) else None
        walked.append(step)
    return out


def _find_stage(items: Any, stage_id: int) -> Any:
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and item.get("stage_id") == stage_id:
            return item
    return None


def _get(doc: Any, path: Sequence[_PathStep], default: Any = None) -> Any:
    node = doc
    for step in path:
        if isinstance(step, _StageRef):
            node = _find_stage(node, step.stage_id)
        elif isinstance(node, dict) and not isinstance(step, int):
            node = node.get(step)
        else:
            return default
        if node is None:
            return default
    return node
