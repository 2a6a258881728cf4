"""How a message names a parsed value: its type in the words YAML users know, and the value
written as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_TYPE_WORDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (Mapping, "mapping"), (list, "list"), (type(None), "null"))


def type_of(value: Any) -> str:
    """``boolean``, ``integer``, ``number``, ``string``, ``mapping``, ``list`` or ``null``
    (bool before int: a YAML ``true`` is not a number)."""
    for kind, word in _TYPE_WORDS:
        if isinstance(value, kind):
            return word
    return type(value).__name__


def show(value: Any) -> str:
    """``value`` as JSON, or its repr where JSON has no spelling for it."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
