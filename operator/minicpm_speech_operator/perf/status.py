"""status.perf as `kubectl get -o yaml` shows it: pure rendering of what the plan decided.

Termination-message keys (tput, ttfp_ms, c, wer as a fraction) become the status's names
(audioThroughput, firstAudioMs, concurrency, werPercent). Absent numbers are left out, not
written as null: the CRD's structural schema has no nullable fields.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .gate import Point
from .results import KindState

POINT_KEYS = {
    "arm": "arm", "c": "concurrency", "tput": "audioThroughput",
    "tput_min": "audioThroughputMin", "tput_max": "audioThroughputMax",
    "ttfp_ms": "firstAudioMs", "ttfp_p95_ms": "firstAudioP95Ms", "rtf": "rtf",
    "rps": "requestThroughput", "ok": "successful", "n": "total", "mem_mib": "peakMemoryMiB",
}


def compact(values: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None and value != ""}


def percent(fraction: float | None) -> float | None:
    return None if fraction is None else round(fraction * 100.0, 3)


def status_points(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    baseline = doc.get("baseline")
    rendered = []
    for point in doc.get("points") or []:
        entry = {POINT_KEYS[key]: value for key, value in point.items() if key in POINT_KEYS}
        entry["role"] = "baseline" if baseline and point.get("arm") == baseline else "candidate"
        rendered.append(compact(entry))
    return rendered


def status_wer_points(entries: Sequence[Point]) -> list[dict[str, Any]]:
    return [compact({
        "concurrency": e["c"], "werPercent": percent(e.get("wer")), "completed": e.get("done"),
        "judged": e.get("judged"), "total": e.get("n"),
        "rescoredWerPercent": percent(e.get("rescored")),
        "rescoredJudged": e.get("rescored_judged"),
        **figures(e),
    }) for e in entries]


def figures(entry: Point) -> dict[str, Any]:
    """Speaker similarity and naturalness: mean, 10th percentile and utterances scored."""
    return {"sim": entry.get("sim"), "simP10": entry.get("sim_p10"),
            "simScored": entry.get("sim_n"), "mos": entry.get("mos"),
            "mosP10": entry.get("mos_p10"), "mosScored": entry.get("mos_n")}


def headline(points: Sequence[Point], concurrency: int) -> dict[str, Any] | None:
    point = next((p for p in points if p["c"] == concurrency), None)
    if point is None:
        return None
    return compact({"concurrency": concurrency, "audioThroughput": point.get("tput"),
                    "firstAudioMs": point.get("ttfp_ms"),
                    "firstAudioP95Ms": point.get("ttfp_p95_ms")})


def quality(doc: Mapping[str, Any]) -> dict[str, Any] | None:
    """The first entry: the program reports C8, the published concurrency, first; with the
    models behind its SIM and MOS."""
    entries = doc.get("wer") or []
    if not entries:
        return None
    e = entries[0]
    return compact({"concurrency": e["c"], "werPercent": percent(e.get("wer")),
                    "completed": e.get("done"), "judged": e.get("judged"), "total": e.get("n"),
                    "rescoredWerPercent": percent(e.get("rescored")),
                    "sim": e.get("sim"), "mos": e.get("mos"),
                    "simModel": doc.get("sim_model"), "mosModel": doc.get("mos_model")})


def kind_status(state: KindState, max_attempts: int) -> dict[str, Any]:
    """One Job kind's line: the newest attempt and how it stands."""
    return compact({
        "job": state.job, "attempt": state.attempt or None, "maxAttempts": max_attempts,
        "state": state.state, "reason": state.reason, "message": state.message,
        "startedAt": state.started, "finishedAt": state.finished,
    })


def previous_summary(previous: Mapping[str, Any] | None, config_hash: str) -> dict[str, Any] | None:
    """What status.perf said about an earlier hash, moved out of the current fields."""
    if not previous or not previous.get("configHash"):
        return None
    if previous["configHash"] == config_hash:
        kept: dict[str, Any] | None = previous.get("previous")
        return kept
    return compact({
        "configHash": previous["configHash"], "phase": previous.get("phase"),
        "audioThroughput": (previous.get("headline") or {}).get("audioThroughput"),
        "werPercent": (previous.get("quality") or {}).get("werPercent"),
        "finishedAt": previous.get("finishedAt"),
    })
