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


# A figure of the quality run: its key in the message, its name in words, the gate's allowed
# drop, and how it is printed.
@dataclass(frozen=True, slots=True)
class Figure:
    key: str
    name: str
    model_key: str
    max_drop: float
    digits: int


def quality_figures(gate: Gate) -> tuple[Figure, ...]:
    return (Figure("sim", "SIM", "sim_model", gate.max_sim_drop, 3),
            Figure("mos", "MOS", "mos_model", gate.max_mos_drop, 2))


def quality_verdict(gate: Gate, candidate: Mapping[str, Any],
                    last_good: Mapping[str, Any] | None, against: str) -> Verdict:
    """At every quality-run concurrency: mean WER under the absolute ceiling and not worse
    than the last good by more than the allowed points; speaker similarity and naturalness
    measured (never missing, NaN or a constant 0) and not below the last good's by more than
    the allowed drop. ``candidate`` and ``last_good`` are quality results: ``wer`` entries
    and the models behind SIM and MOS; figures of different models are not compared."""
    entries: Sequence[Point] = candidate.get("wer") or []
    theirs = by_concurrency((last_good or {}).get("wer") or [])
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
        for figure in quality_figures(gate):
            _judge_figure(figure, c, entry, old, candidate, last_good, against, failures, notes)
    if failures:
        return Verdict(False, "Regressed", "; ".join(failures))
    return Verdict(True, "WithinLimits", "; ".join(notes))


def _judge_figure(figure: Figure, c: int, entry: Point, old: Point | None,
                  candidate: Mapping[str, Any], last_good: Mapping[str, Any] | None,
                  against: str, failures: list[str], notes: list[str]) -> None:
    value, counted = entry.get(figure.key), entry.get(f"{figure.key}_n")
    if value is None or not counted or value == 0:
        # 0 exactly is what an evaluator reports when its model never ran
        why = ("was not measured" if value is None or not counted
               else "is exactly 0, which no speech measures")
        failures.append(f"C{c}: {figure.name} {why}")
        return
    model = candidate.get(figure.model_key)
    text = f"C{c}: {figure.name} {value:.{figure.digits}f}"
    if old is None or old.get(figure.key) is None or not last_good:
        notes.append(text)
        return
    old_model = last_good.get(figure.model_key)
    if model != old_model:
        notes.append(f"{text} by {model}, not compared with {against}'s by {old_model}")
        return
    drop = old[figure.key] - value
    text = (f"{text} vs {old[figure.key]:.{figure.digits}f} {against} "
            f"({-drop:+.{figure.digits}f}, limit -{figure.max_drop:g})")
    (failures if drop > figure.max_drop + 1e-9 else notes).append(text)
