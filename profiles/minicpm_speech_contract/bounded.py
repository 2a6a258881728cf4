"""A bounded reader for every YAML and JSON document a user hands any of the programs.

A profile ConfigMap, a ``demo -f`` manifest, a pod's deploy config and a resource's
``spec.profileOverrides`` are all written by someone else. Read naively, a few hundred bytes
of YAML anchors and aliases expand into gigabytes (the "billion laughs"), and a few thousand
nested brackets exhaust Python's recursion limit in the composer, ``copy.deepcopy`` or
jsonschema. Each reader here refuses such input *before* anything expands or recurses:

- :func:`load_yaml` / :func:`load_yaml_all` walk PyYAML's event stream (the parser is a state
  machine, not recursive) and count bytes, nesting depth, nodes and aliases, where an alias
  counts as every node and every level of what it names, with a hard stop at the first limit
  passed. Only then is the text composed and constructed, with a loader that refuses a key
  written twice in one mapping.
- :func:`load_json` bounds bytes and depth with a flat scan of the text, then parses it.
- :func:`check_parsed` measures an object that arrived already parsed (JSON from the API
  server) with an explicit stack, counting a shared object once per place it appears.

Every refusal is a :class:`BoundedInputError` naming the field, the limit and its value, and a
fix; it never quotes the input. Each program turns it into its own error type.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

MESSAGE_LIMIT = 1024  # characters of a BoundedInputError's str(), field, message and fix together


@dataclass(frozen=True, slots=True)
class Limits:
    """What one document (or one multi-document file) may hold.

    The defaults leave a wide margin over anything real while keeping the worst case cheap:

    - ``max_bytes`` 256 KiB: a bundled profile is about 3 KiB and an example manifest under
      2 KiB. 256 KiB is 80 times that, parses in well under a second, and stays below the
      1 MiB a ConfigMap (the rendered deploy config) and the API server's request body allow.
    - ``max_depth`` 32 levels of mappings and lists: a profile nests 5 deep, a manifest with
      overrides about 12. Far below Python's recursion limit (1000) even for code that spends
      three frames per level (the YAML composer, ``copy.deepcopy``, jsonschema).
    - ``max_nodes`` 10,000 scalars, mappings and lists, counted through aliases: a profile holds
      under 100. Bounds the memory of the parsed tree and the time of every later walk.
    - ``max_aliases`` 16: anchors are rare in hand-written profiles and manifests (the bundled
      ones use none), but a few let a user share one block among stages. Each alias still
      counts as everything it names against ``max_nodes`` and ``max_depth``, so a bomb is
      stopped by whichever limit it reaches first, before it expands.
    """

    max_bytes: int = 256 * 1024
    max_depth: int = 32
    max_nodes: int = 10_000
    max_aliases: int = 16


DEFAULT_LIMITS = Limits()


class BoundedInputError(ValueError):
    """Input refused for its size or shape. ``field`` says where it came from, ``message``
    which limit it passed (and the limit's value), ``fix`` what to do. Never quotes the input;
    ``str()`` is at most :data:`MESSAGE_LIMIT` characters."""

    def __init__(self, field: str, message: str, fix: str) -> None:
        self.field = _cap(field, 256)
        self.fix = _cap(fix, 256)
        self.message = _cap(message, MESSAGE_LIMIT - len(self.field) - len(self.fix) - 4)
        super().__init__(f"{self.field}: {self.message}. {self.fix}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.field, self.message, self.fix))


def _cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


# --- the refusals, one per limit ------------------------------------------------------------


def _too_big(field: str, limits: Limits, size: str) -> BoundedInputError:
    return BoundedInputError(
        field,
        f"is {size}, over the limit of {limits.max_bytes} bytes (max_bytes)",
        "Make it smaller: keep only the settings that differ from the defaults",
    )


def _too_deep(field: str, limits: Limits) -> BoundedInputError:
    return BoundedInputError(
        field,
        f"nests deeper than the limit of {limits.max_depth} levels of mappings and lists "
        "(max_depth)",
        "Flatten it; a profile or manifest never needs that many levels",
    )


def _too_many_nodes(field: str, limits: Limits) -> BoundedInputError:
    return BoundedInputError(
        field,
        f"holds more than the limit of {limits.max_nodes} values, mappings and lists "
        "(max_nodes, counting what each YAML alias repeats)",
        "Make it smaller, and write repeated blocks out instead of through nested aliases",
    )


def _too_many_aliases(field: str, limits: Limits) -> BoundedInputError:
    return BoundedInputError(
        field,
        f"uses more than the limit of {limits.max_aliases} YAML aliases (max_aliases)",
        "Write the repeated blocks out instead of referring to them with *alias",
    )


def _size_words(size: int, *, at_least: bool = False) -> str:
    return f"{'at least ' if at_least else ''}{size} bytes"


# --- YAML -----------------------------------------------------------------------------------


class StrictLoader(yaml.SafeLoader):
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
                    f"found duplicate key {_cap(repr(key), 80)}",
                    key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


@dataclass(slots=True)
class _Open:
    """A mapping or list being walked: its expanded node count and depth so far."""

    anchor: str | None
    nodes: int = 1
    depth: int = 1  # levels from this collection down, itself included


def check_yaml(text: str, *, field: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse ``text`` if it, or what its aliases expand to, passes a limit.

    Walks the event stream only: nothing is composed or constructed, so nothing expands.
    Syntax errors surface as PyYAML's own :class:`yaml.YAMLError`.
    """
    if len(text) > limits.max_bytes or len(text.encode("utf-8")) > limits.max_bytes:
        raise _too_big(field, limits, _size_words(len(text.encode("utf-8"))))
    total = aliases = 0
    # Per anchor: the nodes and levels it stands for, aliases inside it expanded.
    anchored: dict[str, tuple[int, int]] = {}
    stack: list[_Open] = []

    def add(nodes: int, depth: int) -> None:
        nonlocal total
        total += nodes
        if total > limits.max_nodes:
            raise _too_many_nodes(field, limits)
        if len(stack) + depth > limits.max_depth:
            raise _too_deep(field, limits)
        for level, open_ in enumerate(stack):
            open_.nodes += nodes
            open_.depth = max(open_.depth, len(stack) - level + depth)

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.ScalarEvent):
            add(1, 0)
            if event.anchor is not None:
                anchored[event.anchor] = (1, 0)
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > limits.max_aliases:
                raise _too_many_aliases(field, limits)
            # An alias to an anchor still open (a recursive structure) names an unfinished
            # node; the composer refuses it, so count it as one node here.
            nodes, depth = anchored.get(event.anchor or "", (1, 0))
            add(nodes, depth)
        elif isinstance(event, yaml.CollectionStartEvent):
            add(1, 1)
            stack.append(_Open(event.anchor))
        elif isinstance(event, yaml.CollectionEndEvent):
            closed = stack.pop()
            if closed.anchor is not None:
                anchored[closed.anchor] = (closed.nodes, closed.depth)
        elif isinstance(event, yaml.DocumentEndEvent):
            anchored.clear()  # anchors are per document


def load_yaml(text: str, *, field: str, limits: Limits = DEFAULT_LIMITS) -> Any:
    """One YAML document, refused with :class:`BoundedInputError` before any expansion if it
    passes ``limits``; a key written twice in one mapping is a :class:`yaml.YAMLError`."""
    check_yaml(text, field=field, limits=limits)
    return yaml.load(text, Loader=StrictLoader)


def load_yaml_all(text: str, *, field: str, limits: Limits = DEFAULT_LIMITS) -> list[Any]:
    """Every document of a YAML stream (``---`` separated), the limits applying to the whole."""
    check_yaml(text, field=field, limits=limits)
    return list(yaml.load_all(text, Loader=StrictLoader))


# --- JSON -----------------------------------------------------------------------------------


# Kubernetes' API server decodes JSON nested up to this many levels, and so stores objects as
# deep: a client that reads what it stores, the operator among them, must decode them too.
API_SERVER_MAX_JSON_DEPTH = 10_000


def json_depth(text: str, *, stop_above: int) -> int:
    """How deep the mappings and lists of a JSON text nest, by a flat scan (brackets inside
    strings do not count); the scan stops as soon as the depth passes ``stop_above``."""
    depth, deepest, in_string, escaped = 0, 0, False, False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if depth > stop_above:
                break
        elif char in "]}":
            depth -= 1
    return deepest


def load_json(text: str, *, field: str, limits: Limits = DEFAULT_LIMITS) -> Any:
    """A JSON document, refused before parsing if it passes the byte or depth limit, and
    after parsing (nothing recursive having run on it) if it holds too many values."""
    if len(text) > limits.max_bytes or len(text.encode("utf-8")) > limits.max_bytes:
        raise _too_big(field, limits, _size_words(len(text.encode("utf-8"))))
    if json_depth(text, stop_above=limits.max_depth) > limits.max_depth:
        raise _too_deep(field, limits)
    document = json.loads(text)
    check_parsed(document, field=field, limits=limits)
    return document


# --- already parsed -------------------------------------------------------------------------


def _walk(value: Any) -> Iterator[tuple[Any, int, str | None]]:
    """Every node of ``value`` with its depth (a scalar at the top is 0, a mapping 1) and the
    top-level key or index it sits under; a shared object is visited once per place."""
    stack: list[tuple[Any, int, str | None]] = [(value, 0, None)]
    while stack:
        node, depth, top = stack.pop()
        if isinstance(node, dict):
            yield node, depth + 1, top
            for key, child in node.items():
                stack.append((key, depth + 1, top if depth else str(key)))
                stack.append((child, depth + 1, top if depth else str(key)))
        elif isinstance(node, list | tuple):
            yield node, depth + 1, top
            for index, child in enumerate(node):
                stack.append((child, depth + 1, top if depth else f"[{index}]"))
        else:
            yield node, depth, top


def check_parsed(value: Any, *, field: str, limits: Limits = DEFAULT_LIMITS) -> None:
    """Refuse an already-parsed document (mappings, lists, scalars) that passes ``limits``.

    Iterative, with a hard stop: it never recurses and never visits more than
    ``limits.max_nodes + 1`` nodes, however deep or shared the object. Size is the length the
    document would have written as compact JSON, estimated from its strings and numbers. The
    refusal names ``field`` plus the top-level key the limit was passed under.
    """
    size = 0
    for nodes, (node, depth, top) in enumerate(_walk(value), start=1):
        where = field if top is None else (f"{field}{top}" if top.startswith("[")
                                           else f"{field}.{top}")
        if nodes > limits.max_nodes:
            raise _too_many_nodes(where, limits)
        if depth > limits.max_depth:
            raise _too_deep(where, limits)
        if isinstance(node, str):
            size += len(node) + 3  # quotes and a separator
        elif isinstance(node, dict | list | tuple):
            size += 2
        elif isinstance(node, int):  # no str(): a huge int would cost more than it says
            size += node.bit_length() // 3 + 2
        else:
            size += 25
        if size > limits.max_bytes:
            raise _too_big(where, limits, _size_words(size, at_least=True))
