"""Walking a key path through a parsed YAML or JSON document."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def dig(document: Any, path: Sequence[str], default: Any = None) -> Any:
    """The value at ``path`` (mapping keys, outermost first), or ``default`` when any step
    is missing, null or not a mapping."""
    node = document
    for key in path:
        if not isinstance(node, Mapping):
            return default
        node = node.get(key)
        if node is None:
            return default
    return node
