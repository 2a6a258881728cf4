"""Plain-text views of a resource and its children, like `kubectl get` would print."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from .status import find_condition


def table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


def status_table(speech: Mapping[str, Any]) -> str:
    status = speech.get("status") or {}
    ready = find_condition(status, "Ready").get("status", "")
    perf = status.get("perf") or {}
    rows = [
        ["NAME", "PROFILE", "PHASE", "READY", "CONFIG", "AUDIO-S/S", "WER"],
        [
            speech["metadata"]["name"],
            status.get("profile", ""),
            status.get("phase", ""),
            ready,
            status.get("configHash", ""),
            str((perf.get("headline") or {}).get("audioThroughput", "")),
            str((perf.get("quality") or {}).get("werPercent", "")),
        ],
    ]
    return table(rows)


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
