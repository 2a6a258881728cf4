"""Reduce a sweep's official result files to per-arm, per-concurrency points.

Inputs: the artifacts dir of a sweep (its `manifest.json`, or result files named
`{arm}.{visit}-c{C}-measured{r}.json` when there is no manifest). Outputs: `summary.json`,
`summary.md`, `throughput.png`, `first_audio_latency.png` (+ `plots.json`, the plotted data),
and the compact termination message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

from minicpm_speech_contract import termination

from .results import ResultFormatError, RunResult, parse_run

MANIFEST = "manifest.json"
SUMMARY_SCHEMA = "minicpm-speech-perf/summary/v1"
_MEASURED_NAME = re.compile(
    r"^(?P<arm>[A-Za-z][A-Za-z0-9_-]{0,15})\.(?P<visit>\d+)-c(?P<c>\d+)-measured\d+\.json$"
)


class SummaryError(ValueError):
    """Artifacts that cannot be summarised (no measured runs, a bad manifest)."""


@dataclass(frozen=True, slots=True)
class Measured:
    arm: str
    visit: str
    result: RunResult
    peak_mib: float | None


@dataclass(frozen=True, slots=True)
class Point:
    arm: str
    concurrency: int
    runs: int
    audio_tput: float
    audio_tput_min: float
    audio_tput_max: float
    ttfp_ms: float | None
    ttfp_ms_min: float | None
    ttfp_ms_max: float | None
    ttfp_p95_ms: float | None
    rtf: float | None
    req_tput: float
    ok: int
    total: int
    peak_mib: float | None


def load_manifest(artifacts: Path) -> dict[str, Any] | None:
    path = artifacts / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SummaryError(f"{path}: unreadable manifest: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("visits"), list):
        raise SummaryError(f"{path}: key 'visits': expected a list")
    return data


def measured_from_manifest(artifacts: Path, manifest: dict[str, Any]) -> list[Measured]:
    out: list[Measured] = []
    try:
        for visit in manifest["visits"]:
            for run in visit.get("runs", []):
                if run.get("kind") != "measured" or run.get("exit_code") != 0:
                    continue
                path = artifacts / run["result"]
                result = parse_run(path, expect_concurrency=int(run["concurrency"]))
                mem = run.get("gpu_memory") or {}
                peak = mem.get("peak_mib") if mem.get("available") else None
                label = f"{visit['arm']}{visit['index']}"
                out.append(Measured(visit["arm"], label, result, peak))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, ResultFormatError):
            raise
        raise SummaryError(
            f"{artifacts / MANIFEST}: malformed visit or run entry: {exc!r}"
        ) from None
    return out


def measured_from_names(files: Iterable[Path]) -> list[Measured]:
    """Without a manifest, the arm and concurrency come from the result file names."""
    out: list[Measured] = []
    for path in sorted(files):
        m = _MEASURED_NAME.match(path.name)
        if m is None:
            continue
        result = parse_run(path, expect_concurrency=int(m["c"]))
        out.append(Measured(m["arm"], f"{m['arm']}{m['visit']}", result, None))
    return out


def aggregate(measured: Sequence[Measured]) -> list[Point]:
    """One point per (arm, C), arms in first-seen order and C ascending."""
    groups: dict[tuple[str, int], list[Measured]] = {}
    for m in measured:
        groups.setdefault((m.arm, m.result.concurrency), []).append(m)
    arms = list(dict.fromkeys(m.arm for m in measured))
    keys = sorted(groups, key=lambda k: (arms.index(k[0]), k[1]))
    return [_point(arm, c, groups[(arm, c)]) for arm, c in keys]


def _point(arm: str, c: int, group: list[Measured]) -> Point:
    runs = [m.result for m in group]
    tputs = [r.audio_throughput for r in runs]
    ttfp_runs = [r for r in runs if r.mean_ttfp_ms is not None]
    ttfp_means = [r.mean_ttfp_ms for r in ttfp_runs if r.mean_ttfp_ms is not None]
    p95s = [r.p95_ttfp_ms for r in ttfp_runs if r.p95_ttfp_ms is not None]
    peaks = [m.peak_mib for m in group if m.peak_mib is not None]
    return Point(
        arm=arm,
        concurrency=c,
        runs=len(runs),
        audio_tput=fmean(tputs),
        audio_tput_min=min(tputs),
        audio_tput_max=max(tputs),
        # Weighted by each run's sample count: a run with failures has fewer first audios.
        ttfp_ms=_weighted([(r.mean_ttfp_ms, r.ttfp_samples) for r in ttfp_runs]),
        ttfp_ms_min=min(ttfp_means) if ttfp_means else None,
        ttfp_ms_max=max(ttfp_means) if ttfp_means else None,
        # Per-request first-audio times are not in the file, so runs' p95s are averaged.
        ttfp_p95_ms=fmean(p95s) if p95s else None,
        rtf=_weighted([(r.mean_rtf, r.rtf_samples) for r in runs if r.mean_rtf is not None]),
        req_tput=fmean(r.request_throughput for r in runs),
        ok=sum(r.completed for r in runs),
        total=sum(r.num_prompts for r in runs),
        peak_mib=max(peaks) if peaks else None,
    )


def _weighted(pairs: Sequence[tuple[float | None, int]]) -> float | None:
    pairs = [(v, n) for v, n in pairs if v is not None and n > 0]
    total = sum(n for _, n in pairs)
    if not total:
        return None
    return sum(v * n for v, n in pairs if v is not None) / total


def comparison(points: Sequence[Point], baseline: str | None) -> list[dict[str, Any]]:
    """Candidate vs baseline per C: relative change of throughput and p95 first audio."""
    if baseline is None:
        return []
    base = {p.concurrency: p for p in points if p.arm == baseline}
    rows = []
    for p in points:
        b = base.get(p.concurrency)
        if p.arm == baseline or b is None:
            continue
        rows.append(
            {
                "arm": p.arm,
                "baseline": baseline,
                "concurrency": p.concurrency,
                "audio_tput_change": _rel(p.audio_tput, b.audio_tput),
                "ttfp_p95_change": _rel(p.ttfp_p95_ms, b.ttfp_p95_ms),
            }
        )
    return rows


def _rel(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return new / old - 1.0


def markdown(points: Sequence[Point], header: dict[str, Any]) -> str:
    """The human table; deterministic so it can be compared against a golden file."""
    lines = [
        f"# Serving benchmark: config `{header.get('config_hash', '?')}`",
        "",
        f"Mode: {header.get('mode', '?')}. Measured runs per point: "
        f"{max((p.runs for p in points), default=0)}. Values are means; ranges are min-max "
        "over the measured runs; p95 is the mean of the runs' p95.",
        "",
        "| Arm | C | Audio throughput (audio-s/s) | First audio mean (ms) "
        "| First audio p95 (ms) | RTF mean | Requests/s | OK / total | Peak GPU memory (MiB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in points:
        lines.append(
            f"| {p.arm} | {p.concurrency} "
            f"| {p.audio_tput:.2f} ({p.audio_tput_min:.2f}-{p.audio_tput_max:.2f}) "
            f"| {_fmt(p.ttfp_ms, '.0f')} | {_fmt(p.ttfp_p95_ms, '.0f')} | {_fmt(p.rtf, '.3f')} "
            f"| {p.req_tput:.2f} | {p.ok}/{p.total} | {_fmt(p.peak_mib, '.0f')} |"
        )
    rows = comparison(points, header.get("baseline"))
    if rows:
        lines += [
            "",
            "| Arm vs baseline | C | Audio throughput | First audio p95 |",
            "|---|---:|---:|---:|",
        ]
        for r in rows:
            lines.append(
                f"| {r['arm']} vs {r['baseline']} | {r['concurrency']} "
                f"| {_pct(r['audio_tput_change'])} | {_pct(r['ttfp_p95_change'])} |"
            )
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} %"


def termination_points(points: Sequence[Point]) -> list[dict[str, Any]]:
    rs = termination.round_sig
    return [
        {
            "arm": p.arm,
            "c": p.concurrency,
            "tput": rs(p.audio_tput),
            "ttfp_ms": rs(p.ttfp_ms),
            "ttfp_p95_ms": rs(p.ttfp_p95_ms),
            "ok": p.ok,
            "n": p.total,
            "tput_min": rs(p.audio_tput_min),
            "tput_max": rs(p.audio_tput_max),
            "rtf": rs(p.rtf),
            "rps": rs(p.req_tput),
            "mem_mib": rs(p.peak_mib, 6),
        }
        for p in points
    ]


def sweep_message(header: dict[str, Any], points: Sequence[Point]) -> str:
    doc = {
        "v": termination.VERSION,
        "kind": "sweep",
        "status": header.get("status", "ok"),
        "hash": header["config_hash"],
        "mode": header["mode"],
        "started": header["started"],
        "finished": header["finished"],
        "reason": header.get("reason", ""),
        "baseline": header.get("baseline"),
        "points": termination_points(points),
    }
    return termination.encode(doc)


def summarize(artifacts: Path, header: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse, aggregate and write every summary artifact; returns the summary document."""
    manifest = load_manifest(artifacts)
    if manifest is not None:
        measured = measured_from_manifest(artifacts, manifest)
    else:
        measured = measured_from_names((artifacts / "results").glob("*.json"))
    info = {**(manifest or {}), **(header or {})}
    info.pop("visits", None)
    points = aggregate(measured)
    if not points and info.get("status", "ok") == "ok":
        raise SummaryError(f"{artifacts}: no measured result files found")
    doc = {
        "schema": SUMMARY_SCHEMA,
        **{k: info.get(k) for k in ("config_hash", "mode", "baseline", "started", "finished")},
        "requests": info.get("requests"),
        "status": info.get("status", "ok"),
        "reason": info.get("reason", ""),
        "points": [asdict(p) for p in points],
        "comparison": comparison(points, info.get("baseline")),
        "runs": [
            {"arm": m.arm, "visit": m.visit, "peak_mib": m.peak_mib, **asdict(m.result)}
            for m in measured
        ],
    }
    (artifacts / "summary.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    (artifacts / "summary.md").write_text(markdown(points, info), encoding="utf-8")
    if points:
        from .plots import write_plots  # matplotlib only when there is something to draw

        write_plots(points, artifacts)
    return doc


__all__ = [
    "Point",
    "ResultFormatError",
    "SummaryError",
    "aggregate",
    "markdown",
    "summarize",
    "sweep_message",
]
