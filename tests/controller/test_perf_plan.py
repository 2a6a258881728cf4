"""One decision per reconcile: Jobs to start and stop, what serves, and what status says."""

from __future__ import annotations

from typing import Any

import jsonschema
from minicpm_speech_contract.termination import parse_termination_message
from minicpm_speech_operator.crd_schema import strict_json_schema, version_schema
from minicpm_speech_operator.perf.jobs import JobRequest, Kind
from minicpm_speech_operator.perf.lastgood import (
    build_lastgood_configmap,
    lastgood_from_configmap,
)
from minicpm_speech_operator.perf.plan import Observed, PerfPlan, plan
from minicpm_speech_operator.perf.results import Attempt, Result
from minicpm_speech_operator.status import build_status

from .perf_builders import FINISHED, arm, last_good, perf_raw, sweep_text, wer_text

STATUS_SCHEMA = jsonschema.Draft4Validator(
    strict_json_schema(version_schema()["properties"]["status"]))


def run(name: str, kind: Kind, config_hash: str, state: str = "active", attempt: int = 1,
        created: str = "2026-11-29T09:00:00Z") -> Attempt:
    return Attempt(name, f"uid-{name}", kind, config_hash, attempt, created,
                   state, "", "2026-11-29T10:00:00Z", FINISHED if state != "active" else None)


def decide(raw: dict[str, Any], attempts: tuple[Attempt, ...] = (), results: dict[str, Result]
           | None = None, *, good: bool = False, ready: bool = True,
           previous: dict[str, Any] | None = None) -> tuple[PerfPlan, str]:
    _, candidate = arm(raw)
    old = None
    if good:
        spec, cfg = arm(perf_raw(changes={"profile": {"name": "high-concurrency"}}))[1].spec, \
            arm(perf_raw(changes={"profile": {"name": "high-concurrency"}}))[1].cfg
        old = last_good(spec, cfg)
    decided = plan(candidate.spec, candidate.cfg, Observed(attempts, results or {}, old, ready),
                   previous)
    if decided.view.status is not None:
        status = build_status(generation=1, served=None, deployment=None, replicas=1,
                              invalid=None, previous={}, now=FINISHED, perf=decided.view)
        # a null is a removal in the merge patch that carries the status, not a value
        stored = {key: value for key, value in status.items() if value is not None}
        errors = list(STATUS_SCHEMA.iter_errors(stored))
        assert errors == [], errors  # a field the schema lacks would be dropped by the server
    return decided, candidate.cfg.config_hash


def kinds(requests: tuple[JobRequest, ...]) -> list[str]:
    return [r.kind for r in requests]


def done(config_hash: str, tput: float = 20.0, baseline: float | None = None,
         wer: float = 0.03) -> tuple[tuple[Attempt, ...], dict[str, Result]]:
    sweep, quality = run("s", "sweep", config_hash, "succeeded"), run("w", "wer", config_hash,
                                                                       "succeeded")
    return (sweep, quality), {
        "s": Result(parse_termination_message(sweep_text(config_hash, tput, baseline)), "", ""),
        "w": Result(parse_termination_message(wer_text(config_hash, wer)), "", ""),
    }


def test_a_new_hash_gets_one_sweep_and_one_wer_job_at_once_when_dedicated() -> None:
    decided, _ = decide(perf_raw())
    assert kinds(decided.create) == ["sweep", "wer"]
    assert all(r.attempt == 1 for r in decided.create)
    assert decided.view.status is not None and decided.view.status["phase"] == "Pending"
    assert not decided.scale_to_zero


def test_running_jobs_are_not_created_again() -> None:
    _, config_hash = decide(perf_raw())
    decided, _ = decide(perf_raw(), (run("s", "sweep", config_hash), run("w", "wer", config_hash)))
    assert decided.create == () and kinds(decided.running) == ["sweep", "wer"]
    assert decided.view.status is not None and decided.view.status["phase"] == "Running"


def test_a_newer_hash_supersedes_running_jobs_and_history_is_bounded() -> None:
    old = (run("old-s", "sweep", "aaa", "active"),
           run("older-s", "sweep", "bbb", "succeeded", created="2026-11-28T00:00:00Z"),
           run("recent-s", "sweep", "ccc", "succeeded", created="2026-11-29T08:00:00Z"))
    decided, _ = decide(perf_raw(historyLimit=2), old)
    deleted = dict(decided.delete)
    assert "superseded" in deleted["old-s"]
    assert "history limit 2" in deleted["older-s"]
    assert "recent-s" not in deleted


def test_maintenance_runs_the_sweep_first_on_the_freed_gpu() -> None:
    decided, config_hash = decide(perf_raw("maintenance"))
    assert kinds(decided.create) == ["sweep"] and decided.scale_to_zero
    assert decided.view.maintenance is not None
    sweep = run("s", "sweep", config_hash, "succeeded")
    results = {"s": Result(parse_termination_message(sweep_text(config_hash, 20.0)), "", "")}
    decided, _ = decide(perf_raw("maintenance"), (sweep,), results)
    assert kinds(decided.create) == ["wer"] and decided.scale_to_zero
    attempts, results = done(config_hash)
    decided, _ = decide(perf_raw("maintenance"), attempts, results)
    assert not decided.scale_to_zero and decided.view.maintenance is None


def test_live_waits_for_the_rollout_and_never_compares_abba() -> None:
    decided, _ = decide(perf_raw("live"), ready=False, good=True)
    assert decided.create == ()
    decided, _ = decide(perf_raw("live"), ready=True, good=True)
    assert kinds(decided.create) == ["sweep"] and decided.create[0].baseline is None


def test_passing_results_become_the_last_good_record() -> None:
    _, config_hash = decide(perf_raw())
    attempts, results = done(config_hash, tput=24.0)
    decided, _ = decide(perf_raw(), attempts, results)
    assert decided.record is not None and decided.record.config_hash == config_hash
    status = decided.view.status
    assert status is not None
    assert status["headline"]["audioThroughput"] == 24.0
    assert status["quality"]["werPercent"] == 3.0
    assert status["baseline"] == {"source": "none"}
    # The record survives its ConfigMap round trip, and the gate then reads it.
    owner, _ = arm(perf_raw())
    record = lastgood_from_configmap(build_lastgood_configmap(owner, decided.record))
    assert record == decided.record


def test_a_failed_gate_rolls_back_only_when_asked() -> None:
    _, config_hash = decide(perf_raw())
    attempts, results = done(config_hash, tput=18.0, baseline=25.0)
    kept, _ = decide(perf_raw(), attempts, results, good=True)
    assert kept.serve is None and kept.record is None
    assert kept.view.gate_problem is not None
    assert "spec.perf.rollback is false" in kept.view.gate_problem.message
    rolled, _ = decide(perf_raw(rollback=True), attempts, results, good=True)
    assert rolled.serve is not None
    spec, cfg = rolled.serve
    assert cfg.profile_label == "high-concurrency" and spec.replicas == 1
    status = rolled.view.status
    assert status is not None and status["rolledBack"]["toHash"] == cfg.config_hash
    assert {c.type: c.status for c in rolled.view.conditions}["RolledBack"] is True


def test_the_baseline_arm_is_the_last_good_config() -> None:
    decided, _ = decide(perf_raw(), good=True)
    sweep = next(r for r in decided.create if r.kind == "sweep")
    assert sweep.baseline is not None
    assert sweep.baseline.cfg.profile_label == "high-concurrency"
    assert next(r for r in decided.create if r.kind == "wer").baseline is None


def test_a_new_hash_moves_the_old_results_to_previous() -> None:
    _, config_hash = decide(perf_raw())
    attempts, results = done(config_hash, tput=24.0)
    before, _ = decide(perf_raw(), attempts, results)
    after, _ = decide(perf_raw(changes={"profile": {"name": "low-latency"}}),
                      previous=dict(before.view.status or {}))
    status = after.view.status
    assert status is not None and "headline" not in status and "quality" not in status
    assert status["previous"] == {"configHash": config_hash, "phase": "Succeeded",
                                  "audioThroughput": 24.0, "werPercent": 3.0,
                                  "finishedAt": FINISHED}


def test_disabling_perf_stops_running_jobs_and_clears_the_status() -> None:
    raw = perf_raw()
    raw["perf"]["enabled"] = False
    decided, _ = decide(raw, (run("s", "sweep", "x"), run("d", "sweep", "y", "succeeded")))
    assert [name for name, _ in decided.delete] == ["s"]
    assert decided.view.status is None and decided.create == ()


def test_a_status_patch_removes_what_the_new_status_dropped() -> None:
    from minicpm_speech_operator.reconciler import with_removals

    old = {"configHash": "a", "headline": {"audioThroughput": 1.0}, "sweep": {"reason": "x"}}
    new = {"configHash": "b", "sweep": {"state": "Running"}}
    assert with_removals(old, new) == {"configHash": "b", "headline": None,
                                       "sweep": {"state": "Running", "reason": None}}
    assert with_removals(old, None) is None
