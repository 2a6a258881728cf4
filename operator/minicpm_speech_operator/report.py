"""Plain-text views of a resource and its children, like `kubectl get` would print."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from .crd_schema import crd


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def status_table(speech: Mapping[str, Any]) -> str:
    """The row `kubectl get minicpmspeech` prints: the CRD's own printer columns, so this view
    and the cluster's never differ (Age, a time since creation, is left out)."""
    columns = [c for c in printer_columns() if c["type"] != "date"]
    rows = [["NAME", *(c["name"].upper() for c in columns)],
            [speech["metadata"]["name"], *(_text(json_path(speech, c["jsonPath"]))
                                           for c in columns)]]
    return table(rows)


def printer_columns(version: str = "v1alpha1") -> list[dict[str, Any]]:
    entry = next(v for v in crd()["spec"]["versions"] if v["name"] == version)
    columns: list[dict[str, Any]] = entry["additionalPrinterColumns"]
    return columns


_PART = re.compile(r"\w+(?:\[[^\]]*\])?")  # a field, with its filter if any
_FILTER = re.compile(r'^(?P<list>\w+)\[\?\(@\.(?P<key>\w+)=="(?P<value>[^"]*)"\)\]$')


def json_path(obj: Any, path: str) -> Any:
    """The value at a printer column's JSONPath: dotted fields, and a list filtered by one
    field's value (`.conditions[?(@.type=="Ready")]`), the forms the CRD uses."""
    for part in _PART.findall(path):
        match = _FILTER.match(part)
        items = obj.get(match["list"] if match else part) if isinstance(obj, Mapping) else None
        if match:
            items = next((i for i in items or [] if isinstance(i, Mapping)
                          and str(i.get(match["key"])) == match["value"]), None)
        obj = items
        if obj is None:
            return None
    return obj


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def conditions_table(speech: Mapping[str, Any]) -> str:
    rows = [["TYPE", "STATUS", "REASON", "MESSAGE"]]
    for c in (speech.get("status") or {}).get("conditions") or []:
        rows.append([c["type"], c["status"], c.get("reason", ""), c.get("message", "")])
    return table(rows)


def children_table(children: Sequence[Mapping[str, Any]]) -> str:
    rows = [["KIND", "NAME", "CONFIG-HASH", "OWNER"]]
    for child in children:
        meta = child["metadata"]
        owner: Mapping[str, Any] = next(iter(meta.get("ownerReferences") or []), {})
        rows.append([
            child["kind"],
            meta["name"],
            (meta.get("labels") or {}).get("serving.minicpm-speech.io/config-hash", ""),
            f"{owner.get('kind', '')}/{owner.get('name', '')}",
        ])
    return table(rows)


def server_command(deployment: Mapping[str, Any]) -> str:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return " ".join([*container.get("command", []), *container.get("args", [])])


def as_yaml(obj: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(obj), sort_keys=False, width=100)
