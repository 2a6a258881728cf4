"""One pure decision per reconcile: which Jobs should exist, what serves, what status says.

Everything here is derived from what the cluster holds (the Jobs, their results, the last
good record) and the spec, so a restart at any point decides the same again: a maintenance
scale-down is open exactly while the current hash's benchmark is unfinished, and the user's
replica count never leaves the spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minicpm_speech_contract.termination import QUALITY_MODEL_KEYS

from ..serving_config import ServingConfig
from ..spec import SpeechSpec
from ..status import DEGRADED, Condition, PerfView
from .gate import Verdict, baseline_points, candidate_points, perf_verdict, quality_verdict
from .jobs import KINDS, Arm, JobRequest
from .lastgood import LastGood, serving_of
from .results import Attempt, KindState, Result, kind_state
from .status import (
    compact,
    headline,
    kind_status,
    percent,
    previous_summary,
    quality,
    status_points,
    status_wer_points,
)

BENCHMARKED, PERF_GATE, QUALITY_GATE = "Benchmarked", "PerfGate", "QualityGate"
ROLLED_BACK, MAINTENANCE = "RolledBack", "Maintenance"


@dataclass(frozen=True, slots=True)
class Observed:
    attempts: tuple[Attempt, ...]  # every Job this resource controls
    results: Mapping[str, Result]  # by Job name: the finished newest attempts of this hash
    last_good: LastGood | None
    serving_ready: bool  # the Deployment serves this hash, every replica warmed up
    # Hashes whose Jobs a profile search still needs (perf.search): never superseded or pruned.
    protected: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class PerfPlan:
    view: PerfView
    serve: tuple[SpeechSpec, ServingConfig] | None  # None: the spec's own configuration
    scale_to_zero: bool
    create: tuple[JobRequest, ...] = ()
    running: tuple[JobRequest, ...] = ()  # active Jobs of this hash: their config must exist
    delete: tuple[tuple[str, str], ...] = ()  # (Job name, why)
    record: LastGood | None = None
    retry_notes: Mapping[str, str] = field(default_factory=dict)  # by kind: why it is retried


def plan(spec: SpeechSpec, cfg: ServingConfig, seen: Observed,
         previous: Mapping[str, Any] | None) -> PerfPlan:
    perf, config_hash = spec.perf, cfg.config_hash
    if not perf.enabled:
        stop = tuple((a.name, "spec.perf.enabled is false")
                     for a in seen.attempts if a.state == "active")
        return PerfPlan(PerfView(None), None, False, delete=stop)
    free = [a for a in seen.attempts if a.config_hash not in seen.protected]
    delete = _superseded(free, config_hash) + _pruned(free, config_hash, perf.history_limit)
    ours = [a for a in seen.attempts if a.config_hash == config_hash]
    last_good = seen.last_good
    if last_good is not None and last_good.config_hash == config_hash and not ours:
        return _from_record(spec, last_good, previous, delete)
    candidate = Arm(spec, cfg)
    baseline = _baseline_arm(spec, last_good, config_hash)
    kinds: dict[str, KindState] = {
        kind: kind_state(kind, ours, seen.results, perf.job.max_attempts) for kind in KINDS}
    # One GPU (maintenance) or one live Service is shared: the sweep goes first there.
    sequential = perf.placement != "dedicated"
    create, running = [], []
    notes: dict[str, str] = {}
    for state in list(kinds.values()):
        kind = state.kind
        request = JobRequest(kind, state.next_attempt or state.attempt, candidate,
                             baseline if kind == "sweep" else None)
        if state.state == "Running":
            running.append(request)
        if state.next_attempt is None:
            continue
        if perf.placement == "live" and not seen.serving_ready:
            kinds[kind] = _waiting(state, f"waiting until every replica serves {config_hash}")
        elif kind == "wer" and sequential and not kinds["sweep"].final:
            kinds[kind] = _waiting(state, "waiting for the sweep: they share "
                                   + ("the GPU" if perf.placement == "maintenance" else
                                      "the serving Service"))
        else:
            create.append(request)
            if state.state == "Retrying":
                notes[kind] = f"{state.reason}: {state.message}"
    verdicts = _verdicts(spec, kinds, last_good, config_hash)
    finished = all(s.final for s in kinds.values())
    failed = [v for v in verdicts.values() if v is not None and not v.passed]
    serve = None
    if failed and finished and perf.rollback and last_good and last_good.config_hash != config_hash:
        serve = serving_of(last_good, spec)
    record = None
    passed = all(v is not None and v.passed for v in verdicts.values())
    if finished and passed and (last_good is None or last_good.config_hash != config_hash):
        record = _record(spec, cfg, kinds, verdicts, last_good)
    scale_to_zero = perf.placement == "maintenance" and not finished
    view = _view(spec, cfg, kinds, verdicts, last_good, serve, scale_to_zero, previous)
    return PerfPlan(view, serve, scale_to_zero, tuple(create), tuple(running), delete, record,
                    notes)


def _superseded(attempts: Sequence[Attempt], config_hash: str) -> tuple[tuple[str, str], ...]:
    return tuple((a.name, f"superseded by serving config {config_hash}")
                 for a in attempts if a.state == "active" and a.config_hash != config_hash)


def _pruned(attempts: Sequence[Attempt], config_hash: str,
            limit: int) -> tuple[tuple[str, str], ...]:
    """Finished Jobs of hashes beyond the newest ``limit`` (the current hash counts first);
    a superseded run is deleted anyway and takes no place in the history."""
    attempts = [a for a in attempts if a.state != "active"]
    newest: dict[str, tuple[str, str]] = {}
    for a in attempts:
        newest[a.config_hash] = max(newest.get(a.config_hash, ("", "")), (a.created, a.name))
    others = sorted((h for h in newest if h != config_hash), key=newest.__getitem__,
                    reverse=True)
    dropped = set(others[max(limit - 1, 0):])
    return tuple((a.name, f"history limit {limit} (spec.perf.historyLimit)")
                 for a in attempts if a.config_hash in dropped)


def _baseline_arm(spec: SpeechSpec, last_good: LastGood | None, config_hash: str) -> Arm | None:
    """ABBA against the last good config, when one image and one model volume can serve
    both arms; otherwise the gate compares with the last good's recorded numbers."""
    if last_good is None or last_good.config_hash == config_hash or spec.perf.placement == "live":
        return None
    served = serving_of(last_good, spec)
    if served is None:
        return None
    old, old_cfg = served
    if old.runtime.image != spec.runtime.image or old.model.claim_name != spec.model.claim_name:
        return None
    return Arm(old, old_cfg)


def _waiting(state: KindState, why: str) -> KindState:
    return KindState(state.kind, "Waiting", state.attempt, state.job, "Waiting", why,
                     state.started, state.finished)


def _verdicts(spec: SpeechSpec, kinds: Mapping[str, KindState], last_good: LastGood | None,
              config_hash: str) -> dict[str, Verdict | None]:
    gate = spec.perf.gate
    if last_good is not None and last_good.config_hash == config_hash:
        # This hash passed before and is the baseline now: its verdicts are the recorded ones.
        recorded = last_good.results.get("gate") or {}
        return {kind: Verdict(True, str((recorded.get(kind) or {}).get("reason", "WithinLimits")),
                              str((recorded.get(kind) or {}).get("message", "")))
                if kinds[kind].state == "Succeeded" else None for kind in ("sweep", "wer")}
    other = last_good if last_good is not None else None
    verdicts: dict[str, Verdict | None] = {"sweep": None, "wer": None}
    sweep, wer = kinds["sweep"].doc, kinds["wer"].doc
    if sweep is not None:
        if sweep.get("baseline"):
            base = baseline_points(sweep)
            against = f"last good {other.config_hash if other else 'config'} (ABBA)"
        elif other is not None:
            base, against = list(other.results.get("points") or []), (
                f"last good {other.config_hash} (recorded)")
        else:
            base, against = None, "nothing"
        verdicts["sweep"] = perf_verdict(gate, candidate_points(sweep), base, against)
    if wer is not None:
        recorded = quality_results(other.results) if other is not None else None
        against = f"last good {other.config_hash}" if other is not None else "nothing"
        verdicts["wer"] = quality_verdict(gate, wer, recorded, against)
    return verdicts


def _record(spec: SpeechSpec, cfg: ServingConfig, kinds: Mapping[str, KindState],
            verdicts: Mapping[str, Verdict | None], last_good: LastGood | None) -> LastGood:
    sweep, wer = kinds["sweep"].doc or {}, kinds["wer"].doc or {}
    return LastGood(
        config_hash=cfg.config_hash,
        profile=cfg.profile_label,
        deploy_config=cfg.deploy_config,
        spec=spec.raw,
        results={
            "points": candidate_points(sweep),
            **quality_results(wer),
            "placement": spec.perf.placement,
            "previousHash": last_good.config_hash if last_good else None,
            "gate": {kind: {"reason": v.reason, "message": v.message}
                     for kind, v in verdicts.items() if v is not None},
            "recordedAt": _finished_at(kinds),
        },
    )


def quality_results(doc: Mapping[str, Any]) -> dict[str, Any]:
    """What a quality result holds for the gate (a Job's message or the last good record):
    its entries and the models behind SIM and MOS."""
    return {"wer": list(doc.get("wer") or []),
            **{key: doc[key] for key in QUALITY_MODEL_KEYS if doc.get(key)}}


def _finished_at(kinds: Mapping[str, KindState]) -> str | None:
    times = [s.finished for s in kinds.values() if s.finished]
    return max(times) if times else None


def _from_record(spec: SpeechSpec, last_good: LastGood, previous: Mapping[str, Any] | None,
                 delete: tuple[tuple[str, str], ...]) -> PerfPlan:
    """The spec returned to the last good config: its recorded results are current again."""
    sweep_doc = {"points": list(last_good.results.get("points") or []), "baseline": None}
    wer_doc = quality_results(last_good.results)
    kinds: dict[str, KindState] = {
        "sweep": KindState("sweep", "Succeeded", 0, None, "LastGood",
                           "recorded when this configuration passed the gate",
                           finished=last_good.recorded_at or None, doc=sweep_doc),
        "wer": KindState("wer", "Succeeded", 0, None, "LastGood",
                         "recorded when this configuration passed the gate",
                         finished=last_good.recorded_at or None, doc=wer_doc),
    }
    cfg = ServingConfig(last_good.profile, last_good.deploy_config, last_good.config_hash)
    verdicts = _verdicts(spec, kinds, last_good, last_good.config_hash)
    view = _view(spec, cfg, kinds, verdicts, last_good, None, False, previous)
    return PerfPlan(view, None, False, delete=delete)


def _view(spec: SpeechSpec, cfg: ServingConfig, kinds: Mapping[str, KindState],
          verdicts: Mapping[str, Verdict | None], last_good: LastGood | None,
          serve: tuple[SpeechSpec, ServingConfig] | None, scale_to_zero: bool,
          previous: Mapping[str, Any] | None) -> PerfView:
    perf, config_hash = spec.perf, cfg.config_hash
    sweep, wer = kinds["sweep"], kinds["wer"]
    phase = _phase(kinds)
    status: dict[str, Any] = {
        "configHash": config_hash,
        "placement": perf.placement,
        "phase": phase,
        "message": _benchmarked(kinds, perf.headline_concurrency).message,
        "startedAt": min((s.started for s in kinds.values() if s.started), default=None),
        "finishedAt": _finished_at(kinds) if phase in ("Succeeded", "Failed") else None,
        "sweep": kind_status(sweep, perf.job.max_attempts),
        "wer": kind_status(wer, perf.job.max_attempts),
    }
    if sweep.doc is not None:
        status["headline"] = headline(candidate_points(sweep.doc), perf.headline_concurrency)
        status["points"] = status_points(sweep.doc)
        status["baseline"] = _baseline_status(sweep.doc, last_good, config_hash)
    if wer.doc is not None:
        status["quality"] = quality(wer.doc)
        status["werPoints"] = status_wer_points(wer.doc.get("wer") or [])
    if last_good is not None:
        points = list(last_good.results.get("points") or [])
        first_wer: Mapping[str, Any] = next(iter(last_good.results.get("wer") or []), {})
        status["lastGood"] = compact({
            "configHash": last_good.config_hash, "profile": last_good.profile,
            "audioThroughput": (headline(points, perf.headline_concurrency) or {}).get(
                "audioThroughput"),
            "werPercent": percent(first_wer.get("wer")),
            "sim": first_wer.get("sim"), "mos": first_wer.get("mos"),
            "recordedAt": last_good.recorded_at,
        })
    if serve is not None:
        status["rolledBack"] = {"fromHash": config_hash, "toHash": serve[1].config_hash}
    if perf.placement == "maintenance":
        status["maintenance"] = {"active": scale_to_zero, "restoreReplicas": spec.replicas}
    status["previous"] = previous_summary(previous, config_hash)
    conditions = [_benchmarked(kinds, perf.headline_concurrency),
                  *_gate_conditions(verdicts, kinds)]
    if serve is not None:
        conditions.append(Condition(
            ROLLED_BACK, True, "GateFailed",
            f"Serving the last good config {serve[1].config_hash} instead of {config_hash}, "
            "which failed the regression gate; the spec is unchanged"))
    maintenance = None
    if perf.placement == "maintenance":
        maintenance = (f"Serving is scaled to 0 while the benchmark of {config_hash} uses its "
                       f"GPU; {spec.replicas} replica(s) return when it finishes"
                       if scale_to_zero else None)
        conditions.append(Condition(MAINTENANCE, scale_to_zero,
                                    "ScaledDownForBenchmark" if scale_to_zero else "Serving",
                                    maintenance or "Serving is not scaled down"))
    return PerfView(compact(status), tuple(conditions),
                    _gate_problem(verdicts, serve, spec, last_good, config_hash), maintenance)


def _phase(kinds: Mapping[str, KindState]) -> str:
    states = {s.state for s in kinds.values()}
    if states == {"Succeeded"}:
        return "Succeeded"
    if "Running" in states or "Retrying" in states:
        return "Running"
    if "Failed" in states and all(s.final for s in kinds.values()):
        return "Failed"
    if "Failed" in states:
        return "Running"
    return "Pending"


def _benchmarked(kinds: Mapping[str, KindState], headline_c: int = 8) -> Condition:
    sweep, wer = kinds["sweep"], kinds["wer"]
    if sweep.state == wer.state == "Succeeded" and sweep.doc is not None and wer.doc is not None:
        best = headline(candidate_points(sweep.doc), headline_c) or {}
        first = quality(wer.doc) or {}
        wer_c = first.get("concurrency", 8)
        return Condition(BENCHMARKED, True, "Measured",
                         f"{best.get('audioThroughput', 'no')} audio-s/s at C{headline_c}, "
                         f"WER {first.get('werPercent', 'n/a')} %, SIM "
                         f"{first.get('sim', 'n/a')}, MOS {first.get('mos', 'n/a')} at C{wer_c}")
    failed = next((s for s in (sweep, wer) if s.state in ("Failed", "Retrying")), None)
    reason = failed.reason if failed else ("Running" if "Running" in (sweep.state, wer.state)
                                           else "Waiting")
    message = "; ".join(f"{s.kind}: {s.state.lower()}, {s.message}" for s in (sweep, wer))
    return Condition(BENCHMARKED, False, reason, message)


def _gate_conditions(verdicts: Mapping[str, Verdict | None],
                     kinds: Mapping[str, KindState]) -> list[Condition]:
    conditions = []
    for kind, kind_name in (("sweep", PERF_GATE), ("wer", QUALITY_GATE)):
        verdict = verdicts[kind]
        if verdict is not None:
            conditions.append(Condition(kind_name, verdict.passed, verdict.reason,
                                        verdict.message))
        elif kinds[kind].state == "Failed":
            conditions.append(Condition(kind_name, None, "NotMeasured",
                                        f"the {kind} Job failed: nothing to judge"))
        else:
            conditions.append(Condition(kind_name, None, "Pending",
                                        f"waiting for the {kind} result"))
    return conditions


def _gate_problem(verdicts: Mapping[str, Verdict | None],
                  serve: tuple[SpeechSpec, ServingConfig] | None, spec: SpeechSpec,
                  last_good: LastGood | None, config_hash: str) -> Condition | None:
    failed = [f"{name}: {v.message}" for name, v in
              ((PERF_GATE, verdicts["sweep"]), (QUALITY_GATE, verdicts["wer"]))
              if v is not None and not v.passed]
    if not failed:
        return None
    if serve is not None:
        after = f"Rolled back to the last good config {serve[1].config_hash}."
    elif not spec.perf.rollback:
        after = f"Still serving {config_hash}: spec.perf.rollback is false."
    elif last_good is None or last_good.config_hash == config_hash:
        after = f"Still serving {config_hash}: there is no last good config to roll back to."
    else:
        after = "Rolling back once both results are in."
    return Condition(DEGRADED, True, "GateFailed",
                     f"Serving config {config_hash} failed the regression gate. "
                     + " ".join(failed) + " " + after)


def _baseline_status(doc: Mapping[str, Any], last_good: LastGood | None,
                     config_hash: str) -> dict[str, Any]:
    if doc.get("baseline") and last_good is not None:
        return {"source": "abba", "configHash": last_good.config_hash}
    if last_good is not None and last_good.config_hash != config_hash:
        return {"source": "lastGood", "configHash": last_good.config_hash}
    return {"source": "none"}
