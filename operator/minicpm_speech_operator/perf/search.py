"""The profile search (spec.profile.search): which candidates there are, which one to
benchmark next, and which one serves.

Like :mod:`.plan`, the decision is a pure function of the spec and of what the cluster holds:
each candidate's perf Jobs (named and labelled by its config hash, built by :mod:`.jobs`) and
their results. A restart therefore decides the same, and a finished candidate is never
benchmarked again. Candidates run one at a time, each on a GPU of its own (placement
dedicated); the spec's own profile is the first. Until a winner is chosen, the measured
candidate that last passed the gate serves, or else the spec's own, and :mod:`.plan` benchmarks
whatever serves. Once every candidate is measured or the GPU budget is spent, the candidate
with the highest audio throughput at spec.slo.concurrency that meets every SLO target wins;
the reconciler then serves it, and :mod:`.plan` gates it against the last good configuration
like any other new configuration.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from ..errors import InvalidSpec, capped
from ..profiles import merge_overrides
from ..serving_config import ServingConfig, profile_document, serving_config
from ..slo import Slo, grid_override
from ..spec import SpeechSpec, parse_spec
from ..status import Condition
from .jobs import KINDS, Arm, JobRequest, Kind
from .results import Attempt, KindState, Result, kind_state
from .status import compact, quality, status_points

SLO = "SLO"
Phase = Literal["Searching", "Chosen", "NoCandidateMeetsSlo"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration the search may serve; ``problem`` says why it cannot be rendered."""

    label: str
    spec: SpeechSpec | None
    cfg: ServingConfig | None
    problem: str = ""

    @property
    def config_hash(self) -> str:
        return self.cfg.config_hash if self.cfg is not None else ""


def candidates(spec: SpeechSpec, own: ServingConfig) -> tuple[Candidate, ...]:
    """The spec's own configuration first, then each listed bundled profile with each grid
    combination, all on top of spec.profileOverrides; one candidate per config hash."""
    search = spec.profile.search
    found = [Candidate(own.profile_label, spec, own)]
    seen = {own.config_hash}
    for name in search.profiles:
        for combination in search.combinations():
            candidate = _candidate(spec, name, combination)
            if candidate.cfg is not None and candidate.config_hash in seen:
                continue
            seen.add(candidate.config_hash)
            found.append(candidate)
    return tuple(found)


def _candidate(spec: SpeechSpec, name: str, combination: tuple[tuple[str, Any], ...]
               ) -> Candidate:
    label = name + ("/" + ",".join(f"{key}={value}" for key, value in combination)
                    if combination else "")
    overrides = dict(spec.profile_overrides)
    for key, value in combination:
        overrides = merge_overrides(overrides, grid_override(key, value))
    try:
        chosen = parse_spec({**spec.raw, "profile": {"name": name},
                             "profileOverrides": overrides})
        cfg = serving_config(chosen, profile_document(chosen, None))
    except InvalidSpec as error:
        return Candidate(label, None, None, str(error))
    return Candidate(label, chosen, replace(cfg, profile_label=label))


@dataclass(frozen=True, slots=True)
class Figures:
    """What an SLO judges, in status.perf's own units, at one sweep concurrency."""

    audio_throughput: float | None
    first_audio_p95_ms: float | None
    failed_requests: int
    wer_percent: float | None
    sim: float | None


def figures_of(points: Sequence[Mapping[str, Any]], first_quality: Mapping[str, Any] | None,
               concurrency: int) -> Figures:
    """From status.perf's ``points`` and ``quality`` (or a candidate's, rendered alike)."""
    point = next((p for p in points if p.get("role") == "candidate"
                  and p.get("concurrency") == concurrency), {})
    quality_run = first_quality or {}
    return Figures(point.get("audioThroughput"), point.get("firstAudioP95Ms"),
                   max(point.get("total", 0) - point.get("successful", 0), 0),
                   quality_run.get("werPercent"), quality_run.get("sim"))


@dataclass(frozen=True, slots=True)
class Miss:
    text: str
    shortfall: float  # how far from the target, as a fraction of it; inf when not measured


def misses(slo: Slo, figures: Figures, reference_wer: float | None) -> list[Miss]:
    """Every SLO target ``figures`` misses; requests that failed at the SLO's concurrency
    miss it too."""
    c, found = slo.concurrency, []
    tput, p95 = figures.audio_throughput, figures.first_audio_p95_ms
    if tput is None:
        found.append(Miss(f"C{c}: no audio throughput was measured", math.inf))
    if figures.failed_requests:
        found.append(Miss(f"C{c}: {figures.failed_requests} requests failed", 1.0))
    target = slo.min_audio_seconds_per_second
    if target is not None and tput is not None and tput < target:
        found.append(Miss(f"C{c}: audio throughput {tput:g} < {target:g} audio-s/s",
                          (target - tput) / target))
    target = slo.first_audio_p95_ms
    if target is not None:
        if p95 is None:
            found.append(Miss(f"C{c}: first-audio p95 was not measured", math.inf))
        elif p95 > target:
            found.append(Miss(f"C{c}: first-audio p95 {p95:g} > {target:g} ms",
                              (p95 - target) / target))
    target = slo.max_wer_delta_points
    if target is not None:
        delta = wer_delta(figures.wer_percent, reference_wer)
        if delta is None:
            found.append(Miss("WER or the spec's own profile's WER was not measured", math.inf))
        elif delta > target + 1e-9:
            found.append(Miss(f"WER {figures.wer_percent:g} % is {delta:+.2f} points over the "
                              f"spec's own profile's {reference_wer:g} % (limit +{target:g})",
                              (delta - target) / max(target, 1.0)))
    target = slo.min_sim
    if target is not None:
        if figures.sim is None:
            found.append(Miss("SIM was not measured", math.inf))
        elif figures.sim < target:
            found.append(Miss(f"SIM {figures.sim:.3f} < {target:g}",
                              (target - figures.sim) / max(abs(target), 0.1)))
    return found


def wer_delta(wer: float | None, reference: float | None) -> float | None:
    return None if wer is None or reference is None else round(wer - reference, 3)


def gpu_minutes(attempts: Iterable[Attempt]) -> float:
    """GPU time of finished Jobs, from the start and completion times the Job reports."""
    total = 0.0
    for a in attempts:
        if a.state == "active" or not a.started or not a.finished:
            continue
        try:
            took = (datetime.datetime.fromisoformat(a.finished)
                    - datetime.datetime.fromisoformat(a.started))
        except ValueError:
            continue
        total += max(took.total_seconds(), 0.0) / 60.0
    return round(total, 1)


@dataclass(frozen=True, slots=True)
class Measured:
    """One candidate as the cluster shows it."""

    candidate: Candidate
    state: Literal["Waiting", "Running", "Measured", "Failed", "Invalid", "NotMeasured"]
    kinds: Mapping[Kind, KindState]
    figures: Figures | None = None


@dataclass(frozen=True, slots=True)
class SearchPlan:
    status: Mapping[str, Any]  # status.profileSearch
    phase: Phase
    create: tuple[JobRequest, ...] = ()
    running: tuple[JobRequest, ...] = ()  # active Jobs of candidates: their config must exist
    protected: frozenset[str] = frozenset()  # config hashes whose Jobs the search still needs
    winner: Candidate | None = None
    serve: Candidate | None = None  # the winner, or what serves until there is one
    retry_notes: Mapping[str, str] | None = None  # by config hash and kind: why it is retried


def decide(spec: SpeechSpec, found: Sequence[Candidate], attempts: Sequence[Attempt],
           results: Mapping[str, Result], last_good_hash: str | None) -> SearchPlan:
    """Which candidate to benchmark next (none while one runs, or once the budget is spent),
    and which one serves: the winner once none is left, and until then the measured candidate
    that last passed the gate (``last_good_hash``), or else the spec's own. What serves is
    benchmarked by the plan of what serves, so the search starts no Job of it."""
    assert spec.slo is not None
    search, slo = spec.profile.search, spec.slo
    hashes = {c.config_hash for c in found if c.cfg is not None}
    spent = gpu_minutes(a for a in attempts if a.config_hash in hashes)
    rows = [_measure(spec, c, attempts, results) for c in found]
    # A search extended by a new candidate does not roll the pods back to the spec's own.
    interim = next((r for r in rows if r.state == "Measured"
                    and r.candidate.config_hash == last_good_hash), rows[0])
    serving_hash = interim.candidate.config_hash
    running = any(r.state == "Running" and r.candidate.config_hash != serving_hash for r in rows)
    create: list[JobRequest] = []
    notes: dict[str, str] = {}
    for i, row in enumerate(rows):
        if row.state != "Waiting" or row.candidate.config_hash == serving_hash:
            continue
        if spent >= search.max_gpu_minutes:
            rows[i] = replace(row, state="NotMeasured")
        elif not running and not create:
            create += _requests(row, notes)
    done = all(r.state not in ("Waiting", "Running") for r in rows)
    reference = rows[0].figures.wer_percent if rows[0].figures else None
    verdicts = {r.candidate.config_hash: misses(slo, r.figures, reference)
                for r in rows if r.figures is not None}
    winner, closest = _choose(rows, verdicts) if done else (None, None)
    phase: Phase = "Searching" if not done else "Chosen" if winner else "NoCandidateMeetsSlo"
    budget = (spent, search.max_gpu_minutes)
    table = [_row(r, slo, verdicts.get(r.candidate.config_hash), winner, done, budget,
                  r.candidate.config_hash == serving_hash, reference) for r in rows]
    status = compact({
        "phase": phase,
        "message": capped(_message(phase, rows, winner, closest, verdicts, slo, create,
                                   interim)),
        "concurrency": slo.concurrency,
        "winner": winner.candidate.label if winner else None,
        "winnerConfigHash": winner.candidate.config_hash if winner else None,
        "closest": closest.candidate.label if closest else None,
        "gpuMinutes": spent,
        "maxGpuMinutes": search.max_gpu_minutes,
        "candidates": table,
    })
    running_jobs = tuple(JobRequest(kind, state.attempt, _arm(r.candidate))
                         for r in rows if r.candidate.config_hash != serving_hash
                         for kind, state in r.kinds.items() if state.state == "Running")
    return SearchPlan(status, phase, tuple(create), running_jobs, frozenset(hashes),
                      winner.candidate if winner else None,
                      (winner or interim).candidate, notes)


def _choose(rows: Sequence[Measured], verdicts: Mapping[str, list[Miss]],
            ) -> tuple[Measured | None, Measured | None]:
    """(the winner, None), or (None, the closest): the measured candidate whose misses add up
    to the least, each as a fraction of its target."""
    measured = [r for r in rows if r.figures is not None]
    meeting = [r for r in measured if not verdicts[r.candidate.config_hash]]
    if meeting:
        return max(meeting, key=_throughput), None  # the first of equals: the earlier listed
    closest = min(measured, default=None, key=lambda r: (
        sum(m.shortfall for m in verdicts[r.candidate.config_hash]), -_throughput(r)))
    return None, closest


def _measure(spec: SpeechSpec, candidate: Candidate, attempts: Sequence[Attempt],
             results: Mapping[str, Result]) -> Measured:
    if candidate.cfg is None:
        return Measured(candidate, "Invalid", {})
    ours = [a for a in attempts if a.config_hash == candidate.config_hash]
    kinds = {kind: kind_state(kind, ours, results, spec.perf.job.max_attempts) for kind in KINDS}
    states = {k.state for k in kinds.values()}
    if states == {"Succeeded"}:
        sweep, wer = kinds["sweep"].doc or {}, kinds["wer"].doc or {}
        assert spec.slo is not None
        figures = figures_of(status_points(sweep), quality(wer), spec.slo.concurrency)
        return Measured(candidate, "Measured", kinds, figures)
    if all(k.final for k in kinds.values()):
        return Measured(candidate, "Failed", kinds)
    return Measured(candidate, "Running" if "Running" in states else "Waiting", kinds)


def _arm(candidate: Candidate) -> Arm:
    assert candidate.spec is not None and candidate.cfg is not None
    return Arm(candidate.spec, candidate.cfg)


def _requests(row: Measured, notes: dict[str, str]) -> list[JobRequest]:
    candidate = row.candidate
    arm = _arm(candidate)
    requests = []
    for kind, state in row.kinds.items():
        if state.next_attempt is None:
            continue
        requests.append(JobRequest(kind, state.next_attempt, arm))
        if state.state == "Retrying":
            notes[f"{candidate.config_hash}/{kind}"] = f"{state.reason}: {state.message}"
    return requests


def _throughput(row: Measured) -> float:
    return (row.figures.audio_throughput if row.figures else None) or 0.0


def _row(row: Measured, slo: Slo, found: list[Miss] | None, winner: Measured | None, done: bool,
         budget: tuple[float, int], serving: bool, reference: float | None) -> dict[str, Any]:
    figures = row.figures
    entry: dict[str, Any] = {"candidate": row.candidate.label,
                             "configHash": row.candidate.config_hash or None,
                             "state": row.state}
    if figures is not None:
        entry |= {"audioThroughput": figures.audio_throughput,
                  "firstAudioP95Ms": figures.first_audio_p95_ms,
                  "werPercent": figures.wer_percent,
                  "werDeltaPoints": wer_delta(figures.wer_percent, reference),
                  "sim": figures.sim,
                  "meetsSlo": not found}
    result, reason = _result(row, slo, found, winner, done, budget, serving)
    # Sixteen rows of a kilobyte each at most: the status stays far below an object's limit.
    return compact({**entry, "result": result, "reason": capped(reason)})


def _result(row: Measured, slo: Slo, found: list[Miss] | None, winner: Measured | None,
            done: bool, budget: tuple[float, int], serving: bool) -> tuple[str, str]:
    if row.state == "Invalid":
        return "Invalid", row.candidate.problem
    if row.state == "NotMeasured":
        return "NotMeasured", (f"not benchmarked: the search's GPU budget of {budget[1]} "
                               f"minutes was spent ({budget[0]:g} minutes)")
    if row.state == "Failed":
        failed = [k for k in row.kinds.values() if k.state == "Failed"]
        return "Failed", "; ".join(f"{k.kind}: {k.message}" for k in failed)
    if row.state in ("Waiting", "Running"):
        if row.state == "Running":
            return "Pending", "benchmark running"
        return "Pending", ("serving now: its benchmark starts with the serving configuration's"
                           if serving else "waiting for its turn")
    if found:
        return "MissedSlo", "; ".join(m.text for m in found)
    if not done:
        return "Pending", "meets the SLO; waiting for the other candidates"
    assert winner is not None and row.figures is not None
    c = slo.concurrency
    if row is winner:
        return "Winner", (f"the highest audio throughput that meets the SLO: "
                          f"{_throughput(row):g} audio-s/s at C{c}")
    return "Lost", (f"meets the SLO, but {_throughput(row):g} audio-s/s at C{c} is below the "
                    f"winner {winner.candidate.label}'s {_throughput(winner):g}"
                    if _throughput(row) < _throughput(winner) else
                    f"meets the SLO with the winner's {_throughput(row):g} audio-s/s at C{c}, "
                    "but comes later in the list")


def _message(phase: Phase, rows: Sequence[Measured], winner: Measured | None,
             closest: Measured | None, verdicts: Mapping[str, list[Miss]], slo: Slo,
             create: Sequence[JobRequest], interim: Measured) -> str:
    finished = sum(r.state in ("Measured", "Failed", "Invalid", "NotMeasured") for r in rows)
    if phase == "Searching":
        now = next((r.candidate.label for r in rows if r.state == "Running"), None)
        if create:
            now = next(r.candidate.label for r in rows
                       if r.candidate.config_hash == create[0].config_hash)
        return (f"{finished} of {len(rows)} candidates done"
                + (f"; benchmarking {now}" if now else ""))
    c = slo.concurrency
    if winner is not None and winner.figures is not None:
        meeting = sum(1 for r in rows if r.figures is not None
                      and not verdicts[r.candidate.config_hash])
        return (f"Chose {winner.candidate.label} ({winner.candidate.config_hash}): "
                f"{_throughput(winner):g} audio-s/s at C{c}, first-audio p95 "
                f"{winner.figures.first_audio_p95_ms:g} ms; the highest of {meeting} candidate(s) "
                f"meeting the SLO among {len(rows)}")
    serving = interim.candidate.label + (", the spec's own profile" if interim is rows[0] else
                                         ", the last candidate to pass the gate")
    if closest is None:
        return (f"No candidate meets the SLO: none of the {len(rows)} was measured; "
                f"serving {serving}")
    why = "; ".join(m.text for m in verdicts[closest.candidate.config_hash])
    return (f"No candidate meets the SLO; the closest is {closest.candidate.label} "
            f"({closest.candidate.config_hash}): {why}. Serving {serving}")


def slo_condition(slo: Slo | None, perf: Mapping[str, Any] | None,
                  search: SearchPlan | None) -> Condition | None:
    """The SLO's verdict on the measured configuration (status.perf.configHash), or where the
    search stands; its reason fills the SLO column."""
    if slo is None:
        return None
    if search is not None and search.phase != "Chosen":
        reason = "Searching" if search.phase == "Searching" else search.phase
        return Condition(SLO, None if search.phase == "Searching" else False, reason,
                         str(search.status.get("message", "")))
    if perf is None:
        return Condition(SLO, None, "NotMeasured",
                         "spec.perf.enabled is false: no benchmark measures the SLO")
    if perf.get("phase") == "Failed":
        return Condition(SLO, None, "NotMeasured",
                         f"the benchmark of {perf.get('configHash')} failed: nothing to judge")
    if not perf.get("points") or not perf.get("quality"):
        return Condition(SLO, None, "Pending",
                         f"waiting for the benchmark of {perf.get('configHash')}")
    figures = figures_of(perf["points"], perf["quality"], slo.concurrency)
    reference = figures.wer_percent
    if search is not None:
        rows = search.status.get("candidates") or [{}]
        reference = rows[0].get("werPercent")
    found = misses(slo, figures, reference)
    config_hash = perf.get("configHash")
    if found:
        return Condition(SLO, False, "Missed",
                         f"{config_hash}: " + "; ".join(m.text for m in found))
    return Condition(SLO, True, "Met",
                     f"{config_hash}: {figures.audio_throughput:g} audio-s/s at "
                     f"C{slo.concurrency}, first-audio p95 {figures.first_audio_p95_ms:g} ms, "
                     f"WER {figures.wer_percent} %, SIM {figures.sim}")
