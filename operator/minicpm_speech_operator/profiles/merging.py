"""Overrides deep-merged into a profile, following vLLM-Omni's overlay semantics."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .validation import _is_stage_list


def merge_overrides(profile: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` deep-merged into ``profile``, as vLLM-Omni merges an overlay.

    Mappings merge recursively; ``stages`` and ``platforms.<platform>.stages`` merge item
    by item on ``stage_id``; other lists and scalars are replaced. Neither input is
    changed and the result shares no mutable object with them.
    """
    return _merge(profile, overrides or {}, ())


def _merge(
    base: Mapping[str, Any], over: Mapping[str, Any], path: tuple[str, ...]
) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        key_path = (*path, key)
        current = out.get(key)
        if _is_stage_list(key_path) and isinstance(current, list) and isinstance(value, list):
            out[key] = _merge_stage_lists(current, value, key_path)
        elif isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = _merge(current, value, key_path)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _merge_stage_lists(base: list[Any], over: list[Any], path: tuple[str, ...]) -> list[Any]:
    by_id: dict[int, Any] = {}
    unkeyed: list[Any] = []
    for item in [*base, *over]:
        stage_id = item.get("stage_id") if isinstance(item, dict) else None
        if type(stage_id) is not int:
            unkeyed.append(copy.deepcopy(item))
        elif stage_id in by_id:
            by_id[stage_id] = _merge(by_id[stage_id], item, (*path, "[]"))
        else:
            by_id[stage_id] = copy.deepcopy(item)
    return [*by_id.values(), *unkeyed]
