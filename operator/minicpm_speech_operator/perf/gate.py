"""The regression gate: a candidate's numbers against its baseline's, as pure arithmetic.

Points and WER entries are in the termination message's own keys (tput, ttfp_p95_ms, ok, n;
c, wer as a fraction, judged), whether they come from this Job or from the last good record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..spec import Gate

Point = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reason: str
    message: str


def by_concurrency(entries: Sequence[Point]) -> dict[int, Point]:
    return {int(e["c"]): e for e in entries}


def candidate_points(doc: Mapping[str, Any]) -> list[Point]:
    """The candidate's points of a sweep message: every arm but the baseline."""
    baseline = doc.get("baseline")
    return [p for p in doc.get("points") or [] if p.get("arm") != baseline]


def baseline_points(doc: Mapping[str, Any]) -> list[Point]:
    baseline = doc.get("baseline")
    return [p for p in doc.get("points") or [] if baseline and p.get("arm") == baseline]


def _change(new: float, old: float) -> float:
    return (new - old) / old * 100.0


def perf_verdict(gate: Gate, candidate: Sequence[Point], baseline: Sequence[Point] | None,
                 against: str) -> Verdict:
    """Throughput loss and p95 first-audio rise at each gated concurrency."""
    mine, theirs = by_concurrency(candidate), by_concurrency(baseline or [])
    failures: list[str] = []
    notes: list[str] = []
    for c in gate.concurrencies:
        point = mine.get(c)
        if point is None or point.get("tput") is None:
            failures.append(f"C{c}: no audio throughput was measured")
            continue
        if point.get("ok", 0) < point.get("n", 0):
            failures.append(f"C{c}: {point['n'] - point['ok']} of {point['n']} requests failed")
        base = theirs.get(c)
        if base is None or not base.get("tput"):
            notes.append(f"C{c}: {point['tput']:g} audio-s/s")
            continue
        loss = -_change(point["tput"], base["tput"])
        text = (f"C{c}: audio throughput {point['tput']:g} vs {base['tput']:g} audio-s/s "
                f"({-loss:+.1f} %, limit -{gate.max_throughput_loss_percent:g} %)")
        (failures if loss > gate.max_throughput_loss_percent else notes).append(text)
        p95, base_p95 = point.get("ttfp_p95_ms"), base.get("ttfp_p95_ms")
        if p95 is not None and base_p95:
            rise = _change(p95, base_p95)
            text = (f"C{c}: first-audio p95 {p95:g} vs {base_p95:g} ms "
                    f"({rise:+.1f} %, limit +{gate.max_first_audio_p95_rise_percent:g} %)")
            (failures if rise > gate.max_first_audio_p95_rise_percent else notes).append(text)
    if failures:
        return Verdict(False, "Regressed", f"against {against}: " + "; ".join(failures))
    if baseline is None:
        return Verdict(True, "NoBaseline", "no last good configuration to compare with yet; "
                       + "; ".join(notes))
    return Verdict(True, "WithinLimits", f"against {against}: " + "; ".join(notes))


def quality_verdict(gate: Gate, entries: Sequence[Point], last_good: Sequence[Point] | None,
                    against: str) -> Verdict:
    """Mean WER under the absolute ceiling, and not worse than the last good by more than
    the allowed points, at every quality-run concurrency."""
    theirs = by_concurrency(last_good or [])
    failures: list[str] = []
    notes: list[str] = []
    if not entries:
        failures.append("the quality run reported no concurrency")
    for entry in entries:
        c = int(entry["c"])
        if entry.get("wer") is None or not entry.get("judged"):
            failures.append(f"C{c}: no request was judged ({entry.get('judged', 0)}/"
                            f"{entry.get('n', 0)})")
            continue
        wer = entry["wer"] * 100.0
        text = f"C{c}: WER {wer:.2f} % (limit {gate.max_wer_percent:g} %)"
        (failures if wer > gate.max_wer_percent else notes).append(text)
        old = theirs.get(c)
        if old is not None and old.get("wer") is not None:
            rise = wer - old["wer"] * 100.0
            text = (f"C{c}: WER {rise:+.2f} points vs {against} "
                    f"(limit +{gate.max_wer_increase_points:g})")
            (failures if rise > gate.max_wer_increase_points else notes).append(text)
    if failures:
        return Verdict(False, "Regressed", "; ".join(failures))
    return Verdict(True, "WithinLimits", "; ".join(notes))
