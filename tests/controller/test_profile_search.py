"""spec.slo and spec.profile.search: the rules a spec obeys (judged alike by the CRD and by the
operator), the candidates, and the pure decision: which candidate to benchmark next, which one
serves, and what status.profileSearch and the SLO condition say."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from minicpm_speech_contract.extras import BY_NAME, PRECISIONS
from minicpm_speech_contract.termination import parse_termination_message
from minicpm_speech_operator.crd_schema import strict_json_schema, version_schema
from minicpm_speech_operator.errors import InvalidSpec
from minicpm_speech_operator.manifests import build_children, owner_of
from minicpm_speech_operator.perf.jobs import KINDS, build_job, build_job_configmap
from minicpm_speech_operator.perf.plan import Observed, plan
from minicpm_speech_operator.perf.results import Attempt, Result
from minicpm_speech_operator.perf.search import (
    Candidate,
    SearchPlan,
    candidates,
    decide,
    slo_condition,
)
from minicpm_speech_operator.reconciler import search_events
from minicpm_speech_operator.slo import GRID_EXTRAS, GRID_KEYS, grid_override
from minicpm_speech_operator.spec import SpeechSpec, parse_spec
from minicpm_speech_perf.config import parse_quality, parse_sweep
from minicpm_speech_perf.summarize import sweep_message

from .builders import speech_body
from .perf_builders import FINISHED, STARTED, arm, perf_raw, point, wer_text
from .test_manifests import KUBERNETES_VERSION
from .test_names_and_rules import server_refusals, with_spec

SEARCH_SCHEMA = jsonschema.Draft4Validator(strict_json_schema(
    version_schema()["properties"]["status"]["properties"]["profileSearch"]))


def searching(profiles: tuple[str, ...] = ("high-concurrency", "low-latency"),
              grid: dict[str, Any] | None = None, search: dict[str, Any] | None = None,
              **slo: Any) -> dict[str, Any]:
    raw = perf_raw()
    raw["profile"] = {"name": "default", "search": {
        "enabled": True, "profiles": list(profiles), **({"grid": grid} if grid else {}),
        **(search or {})}}
    raw["slo"] = {"concurrency": 8, "minAudioSecondsPerSecond": 15, **(
        slo or {"firstAudioP95Ms": 1200})}
    return raw


def found(raw: dict[str, Any]) -> tuple[SpeechSpec, tuple[Candidate, ...]]:
    _, own = arm(raw)
    return own.spec, candidates(own.spec, own.cfg)


def finished(config_hash: str, tput: float, p95: float, wer: float = 0.03, *,
             sweep_ok: bool = True) -> tuple[list[Attempt], dict[str, Result]]:
    """A candidate's sweep and WER Jobs, finished, with the results read off their pods."""
    attempts, results = [], {}
    for kind in KINDS:
        name = f"speech-{kind}-{config_hash}"
        attempts.append(Attempt(name, f"uid-{name}", kind, config_hash, 1, STARTED,
                                "succeeded", "", STARTED, FINISHED))
        if kind == "sweep" and not sweep_ok:
            results[name] = Result(None, "RunFailed", f"Job {name}: the server never came up")
            continue
        text = (sweep_message({"config_hash": config_hash, "mode": "dedicated",
                               "started": STARTED, "finished": FINISHED, "baseline": None},
                              [point("B", c, tput * c / 8, p95) for c in (1, 8)])
                if kind == "sweep" else wer_text(config_hash, wer))
        results[name] = Result(parse_termination_message(text), "", "")
    return attempts, results


def measured(figures: dict[str, tuple[float, float]], all_found: tuple[Candidate, ...],
             **wer: float) -> tuple[list[Attempt], dict[str, Result]]:
    attempts: list[Attempt] = []
    results: dict[str, Result] = {}
    for candidate in all_found:
        if candidate.label in figures:
            more, read = finished(candidate.config_hash, *figures[candidate.label],
                                  wer=wer.get(candidate.label.replace("-", "_"), 0.03))
            attempts += more
            results |= read
    return attempts, results


def checked(decided: SearchPlan) -> SearchPlan:
    errors = [e.message for e in SEARCH_SCHEMA.iter_errors(dict(decided.status))]
    assert errors == [], errors  # a field the CRD lacks would be dropped by the API server
    return decided


def rows(decided: SearchPlan) -> dict[str, dict[str, Any]]:
    return {row["candidate"]: row for row in decided.status["candidates"]}


# --- the spec ----------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "field", "words"), [
    ({**searching(), "slo": {"concurrency": 4, "firstAudioP95Ms": 900}}, "spec.slo.concurrency",
     "not measured"),
    ({**searching(), "slo": {"concurrency": 8}}, "spec.slo", "no target"),
    ({k: v for k, v in searching().items() if k != "slo"}, "spec.slo", "required"),
    ({**searching(), "perf": {**perf_raw()["perf"], "placement": "maintenance"}},
     "spec.perf.placement", "GPU of its own"),
    (searching(grid={"stage2MaxNumSeqs": [4, 8, 16], "precision": ["fp32", "bf16-cache"]}),
     "spec.profile.search.maxCandidates", "make 13 candidates, more than 8"),
    (searching(grid={"precision": ["fp32", "bf16"], "solverSteps": [3, 5]}),
     "spec.profile.search.maxCandidates", "make 9 candidates, more than 8"),
])
def test_bad_slo_or_search_is_refused_naming_the_field(raw: dict[str, Any], field: str,
                                                       words: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(raw)
    assert refused.value.field == field and words in refused.value.message, refused.value
    refusals = server_refusals(with_spec(raw))
    assert len(refusals) == 1 and field.rpartition(".")[2] in refusals[0], refusals


def odd(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    raw = searching()
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


@pytest.mark.parametrize(("raw", "field"), [
    (odd(("slo",), "fast"), "spec.slo"),
    (odd(("slo", "concurrency"), "8"), "spec.slo.concurrency"),
    (odd(("slo", "concurrency"), 3), "spec.slo.concurrency"),
    (odd(("slo", "minSim"), 2), "spec.slo.minSim"),
    (odd(("slo", "firstAudioP95Ms"), 0), "spec.slo.firstAudioP95Ms"),
    (odd(("slo", "typo"), 1), "spec.slo.typo"),
    (odd(("profile", "search", "profiles"), []), "spec.profile.search.profiles"),
    (odd(("profile", "search", "grid"), {"microBatchSize": [0]}),
     "spec.profile.search.grid.microBatchSize[0]"),
    (odd(("profile", "search", "grid"), {"precision": [""]}),
     "spec.profile.search.grid.precision[0]"),
    (odd(("profile", "search", "grid"), {"stage2MaxNumSeqs": [4, 4]}),
     "spec.profile.search.grid.stage2MaxNumSeqs[1]"),
    (odd(("profile", "search", "grid"), {"solverSteps": [0]}),
     "spec.profile.search.grid.solverSteps[0]"),
    (odd(("profile", "search", "grid"), {"solverSteps": [51]}),
     "spec.profile.search.grid.solverSteps[0]"),
    (odd(("profile", "search", "grid"), {"solverSteps": [5, 5]}),
     "spec.profile.search.grid.solverSteps[1]"),
    (odd(("profile", "search", "profiles"), ["low-latency", "low-latency"]),
     "spec.profile.search.profiles[1]"),
    (odd(("profile", "search", "maxGpuMinutes"), 1e308), "spec.profile.search.maxGpuMinutes"),
    (odd(("profile", "search", "maxCandidates"), 17), "spec.profile.search.maxCandidates"),
])
def test_odd_values_are_refused_naming_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(raw)
    assert refused.value.field == field, refused.value


@pytest.mark.parametrize(("raw", "field"), [
    (searching(profiles=("medium",)), "spec.profile.search.profiles[0]"),
    (searching(grid={"precision": ["fp8"]}), "spec.profile.search.grid.precision[0]"),
])
def test_what_only_the_operator_knows_is_refused_with_the_choices(raw: dict[str, Any],
                                                                  field: str) -> None:
    """Bundled profiles and the contract's precisions are the operator's to list: the CRD
    would have to copy them."""
    with pytest.raises(InvalidSpec) as refused:
        parse_spec(raw)
    assert refused.value.field == field and "Use one of" in refused.value.fix


@pytest.mark.parametrize("raw", [
    searching(),
    searching(grid={"stage2MaxNumSeqs": [4, 8, 16], "precision": list(PRECISIONS)[:2]},
              search={"maxCandidates": 16}),
    {**perf_raw(), "slo": {"minSim": 0.6}},
    {**perf_raw(enabled=False), "slo": {"concurrency": 1, "maxWerDeltaPoints": 0.5}},
])
def test_good_slo_and_search_are_accepted(raw: dict[str, Any]) -> None:
    parse_spec(raw)
    assert server_refusals(with_spec(raw)) == []


def test_the_crd_offers_the_grid_keys_the_operator_knows() -> None:
    search = version_schema()["properties"]["spec"]["properties"]["profile"]["properties"][
        "search"]
    assert tuple(search["properties"]["grid"]["properties"]) == GRID_KEYS
    for key in GRID_KEYS:
        assert grid_override(key, 1)  # each key has the override it makes
    # A grid value is a Code2Wav extra: the CRD allows what the contract allows, no more.
    grid = search["properties"]["grid"]["properties"]
    for key, name in GRID_EXTRAS.items():
        extra, items = BY_NAME[name], grid[key]["items"]
        if extra.choices is None and extra.minimum is not None:
            assert (items["minimum"], items["maximum"]) == (extra.minimum, extra.maximum), key


def test_solver_steps_are_a_grid_key_that_sets_the_step_extra() -> None:
    _, all_found = found(searching(("high-concurrency",),
                                      {"precision": ["bf16"], "solverSteps": [3, 5]}))
    assert [c.label for c in all_found] == [
        "default",
        "high-concurrency/precision=bf16,solverSteps=3",
        "high-concurrency/precision=bf16,solverSteps=5"]
    for candidate, steps in zip(all_found[1:], (3, 5), strict=True):
        deploy = candidate.cfg.deploy_config  # type: ignore[union-attr]
        assert f"token2wav_n_timesteps: {steps}" in deploy, deploy
    assert len({c.config_hash for c in all_found}) == 3


def test_without_a_search_block_the_search_is_off_with_the_crd_defaults() -> None:
    search = parse_spec(perf_raw()).profile.search
    assert not search.enabled and search.profiles == ("default", "high-concurrency",
                                                      "low-latency")
    assert (search.max_candidates, search.max_gpu_minutes) == (8, 1440)


# --- the candidates ----------------------------------------------------------------------

def test_the_spec_own_profile_comes_first_and_every_combination_follows() -> None:
    _, all_found = found(searching(("high-concurrency",),
                                      {"stage2MaxNumSeqs": [4, 16], "precision": ["bf16-cache"]}))
    assert [c.label for c in all_found] == [
        "default",
        "high-concurrency/stage2MaxNumSeqs=4,precision=bf16-cache",
        "high-concurrency/stage2MaxNumSeqs=16,precision=bf16-cache"]
    deploy = all_found[2].cfg.deploy_config  # type: ignore[union-attr]
    assert "token2wav_precision: bf16-cache" in deploy and "max_num_seqs: 16" in deploy
    assert len({c.config_hash for c in all_found}) == 3


def test_a_candidate_equal_to_another_is_measured_once() -> None:
    # The default profile already runs stage 2 at 8 sequences: the spec's own configuration.
    _, all_found = found(searching(("default",), {"stage2MaxNumSeqs": [8, 16]}))
    assert [c.label for c in all_found] == ["default", "default/stage2MaxNumSeqs=16"]


def test_a_candidate_the_rules_refuse_is_listed_with_why_and_never_benchmarked() -> None:
    spec, all_found = found(searching(("default", "high-concurrency"), {"microBatchSize": [2]}))
    bad = all_found[1]
    assert bad.cfg is None and "micro_batch_size" in bad.problem
    assert [c.label for c in all_found[1:] if c.cfg is None] == [
        "default/microBatchSize=2", "high-concurrency/microBatchSize=2"]  # each listed
    decided = checked(decide(spec, all_found, [], {}, all_found[0].config_hash))
    assert rows(decided)["default/microBatchSize=2"]["result"] == "Invalid"
    assert decided.create == ()


def test_every_candidate_job_and_the_winner_are_valid_in_strict_mode() -> None:
    raw = searching(("high-concurrency",), {"stage2MaxNumSeqs": [4, 16],
                                            "precision": ["bf16-cache"]})
    owner = owner_of(speech_body(raw))
    spec, all_found = found(raw)
    assert len(all_found) == 3
    attempts: list[Attempt] = []
    results: dict[str, Result] = {}
    for candidate in all_found[1:]:
        sweep, wer = decide(spec, all_found, attempts, results, all_found[0].config_hash).create
        for request in (sweep, wer):
            job = build_job(owner, request)
            kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)
            configmap = build_job_configmap(owner, request, "job-uid")
            kubernetes_validate.validate(configmap, KUBERNETES_VERSION, strict=True)
            config = yaml.safe_load(configmap["data"]["config.yaml"])
            parsed = parse_sweep(config) if request.kind == "sweep" else parse_quality(
                config).sweep
            assert parsed.config_hash == candidate.config_hash
            assert "token2wav_precision: bf16-cache" in configmap["data"]["candidate.yaml"]
        more, read = finished(candidate.config_hash, 20.0, 900.0)
        attempts, results = attempts + more, results | read
    winner = all_found[1]
    assert winner.spec is not None and winner.cfg is not None
    for child in build_children(owner, winner.spec, winner.cfg):
        kubernetes_validate.validate(child, KUBERNETES_VERSION, strict=True)


# --- the decision ------------------------------------------------------------------------

def test_candidates_are_benchmarked_one_at_a_time_beside_what_serves() -> None:
    spec, all_found = found(searching())
    own = all_found[0].config_hash
    decided = checked(decide(spec, all_found, [], {}, own))
    # the serving configuration's Jobs are the plan's; the search starts the next candidate
    assert [(r.kind, r.config_hash) for r in decided.create] == [
        ("sweep", all_found[1].config_hash), ("wer", all_found[1].config_hash)]
    running = [Attempt(f"speech-{k}-{all_found[1].config_hash}", "u", k,
                       all_found[1].config_hash, 1, STARTED, "active", "", STARTED, None)
               for k in KINDS]
    decided = checked(decide(spec, all_found, running, {}, own))
    assert decided.create == () and decided.phase == "Searching"
    # a running candidate's Job config is made sure of, as the plan does for its own
    assert [(r.kind, r.attempt, r.config_hash) for r in decided.running] == [
        (k, 1, all_found[1].config_hash) for k in KINDS]
    assert "benchmarking high-concurrency" in decided.status["message"]
    assert decided.protected == frozenset(c.config_hash for c in all_found)


def test_the_fastest_candidate_that_meets_the_slo_wins_and_each_other_says_why() -> None:
    spec, all_found = found(searching())
    attempts, results = measured({"default": (20.0, 900.0), "high-concurrency": (30.0, 1500.0),
                                  "low-latency": (25.0, 800.0)}, all_found)
    decided = checked(decide(spec, all_found, attempts, results, all_found[0].config_hash))
    assert decided.phase == "Chosen" and decided.winner is all_found[2]
    table = rows(decided)
    assert table["low-latency"]["result"] == "Winner"
    assert table["high-concurrency"]["result"] == "MissedSlo"
    assert table["high-concurrency"]["reason"] == "C8: first-audio p95 1500 > 1200 ms"
    assert table["default"]["result"] == "Lost"
    assert "20 audio-s/s at C8 is below the winner low-latency's 25" in table["default"]["reason"]
    assert decided.status["gpuMinutes"] == 6 * 60.0
    # the same cluster, decided again (a restart), gives the same answer
    again = decide(spec, all_found, list(reversed(attempts)), dict(results),
                   all_found[0].config_hash)
    assert again.status == decided.status


def test_a_wer_over_the_spec_own_profiles_by_more_than_allowed_misses() -> None:
    spec, all_found = found(searching(maxWerDeltaPoints=0.5, minSim=0.7))
    attempts, results = measured({"default": (20.0, 900.0), "high-concurrency": (30.0, 900.0),
                                  "low-latency": (25.0, 800.0)}, all_found,
                                 high_concurrency=0.04)
    table = rows(checked(decide(spec, all_found, attempts, results, all_found[0].config_hash)))
    assert table["high-concurrency"]["werDeltaPoints"] == 1.0
    assert "+1.00 points over the spec's own profile's 3 % (limit +0.5)" in \
        table["high-concurrency"]["reason"]
    assert table["low-latency"]["result"] == "Winner"


def test_no_candidate_meeting_the_slo_names_the_closest_and_serves_nothing_new() -> None:
    spec, all_found = found(searching(firstAudioP95Ms=500))
    attempts, results = measured({"default": (20.0, 900.0), "high-concurrency": (30.0, 600.0),
                                  "low-latency": (12.0, 550.0)}, all_found)
    decided = checked(decide(spec, all_found, attempts, results, all_found[0].config_hash))
    assert decided.phase == "NoCandidateMeetsSlo" and decided.winner is None
    # 20 % over on p95 beats 10 % over plus 20 % short of throughput
    assert decided.status["closest"] == "high-concurrency"
    assert decided.status["message"].startswith(
        "No candidate meets the SLO; the closest is high-concurrency")
    condition = slo_condition(spec.slo, None, decided)
    assert condition is not None and condition.status is False
    assert condition.reason == "NoCandidateMeetsSlo"
    # A looser SLO alone re-decides from the same results: the hashes did not change.
    looser, again = found(searching(firstAudioP95Ms=700))
    assert [c.config_hash for c in again] == [c.config_hash for c in all_found]
    decided = checked(decide(looser, again, attempts, results, again[0].config_hash))
    assert decided.create == () and decided.status["winner"] == "high-concurrency"


def test_a_spent_budget_stops_the_search_and_the_rest_is_reported_unmeasured() -> None:
    spec, all_found = found(searching(search={"maxGpuMinutes": 240}))
    attempts, results = measured({"default": (20.0, 900.0), "high-concurrency": (25.0, 900.0)},
                                 all_found)
    decided = checked(decide(spec, all_found, attempts, results, all_found[0].config_hash))
    assert decided.create == () and decided.phase == "Chosen"
    assert decided.winner is all_found[1]
    unmeasured = rows(decided)["low-latency"]
    assert unmeasured["result"] == "NotMeasured"
    assert "GPU budget of 240 minutes was spent (240 minutes)" in unmeasured["reason"]


def test_a_failed_candidate_is_retried_then_reported_and_never_wins() -> None:
    spec, all_found = found(searching())
    attempts, results = measured({"default": (20.0, 900.0)}, all_found)
    more, read = finished(all_found[1].config_hash, 40.0, 500.0, sweep_ok=False)
    decided = decide(spec, all_found, attempts + more, results | read, all_found[0].config_hash)
    assert [(r.kind, r.attempt) for r in decided.create] == [("sweep", 2)]
    assert decided.retry_notes == {
        f"{all_found[1].config_hash}/sweep": "RunFailed: attempt 1/2 failed: Job "
        f"speech-sweep-{all_found[1].config_hash}: the server never came up"}
    spec = parse_spec({**searching(), "perf": {**perf_raw()["perf"], "job": {"maxAttempts": 1}}})
    _, all_found = found(searching())
    decided = checked(decide(spec, all_found, attempts + more, results | read,
                             all_found[0].config_hash))
    assert rows(decided)["high-concurrency"]["result"] == "Failed"
    assert decided.create[0].config_hash == all_found[2].config_hash


def test_until_a_winner_the_measured_last_good_serves_else_the_spec_own() -> None:
    spec, all_found = found(searching())
    attempts, results = measured({"default": (20.0, 900.0), "high-concurrency": (26.0, 1000.0)},
                                 all_found)
    last_good = all_found[1].config_hash
    decided = decide(spec, all_found, attempts, results, last_good)
    assert decided.phase == "Searching" and decided.serve is all_found[1]
    assert [r.config_hash for r in decided.create] == [all_found[2].config_hash] * 2
    # a last good that is no candidate (an older image), or not measured: the spec's own
    assert decide(spec, all_found, attempts, results, "0ld1mage0000").serve is all_found[0]
    assert decide(spec, all_found, [], {}, last_good).serve is all_found[0]


# --- what serves, and what status says ---------------------------------------------------

def test_jobs_the_search_still_needs_are_never_superseded_or_pruned() -> None:
    _, all_found = found(searching())
    attempts, results = measured({"high-concurrency": (30.0, 600.0),
                                  "low-latency": (12.0, 550.0)}, all_found)
    running = [Attempt(f"speech-{k}-{all_found[1].config_hash}-2", "u", k,
                       all_found[1].config_hash, 2, FINISHED, "active", "", FINISHED, None)
               for k in KINDS]
    own = all_found[0]
    assert own.spec is not None and own.cfg is not None
    unprotected = plan(own.spec, own.cfg, Observed((*attempts, *running), results, None, True),
                       None)
    assert unprotected.delete  # what plan.py does to other hashes' Jobs
    kept = plan(own.spec, own.cfg, Observed((*attempts, *running), results, None, True,
                                            frozenset(c.config_hash for c in all_found)), None)
    assert kept.delete == ()


def test_the_slo_condition_judges_the_measured_configuration() -> None:
    spec = parse_spec({**perf_raw(), "slo": {"firstAudioP95Ms": 1000,
                                             "minAudioSecondsPerSecond": 15}})
    assert slo_condition(None, None, None) is None
    off = slo_condition(spec.slo, None, None)
    assert off is not None and (off.status, off.reason) == (None, "NotMeasured")
    failed = slo_condition(spec.slo, {"configHash": "abc", "phase": "Failed"}, None)
    assert failed is not None and failed.message == "the benchmark of abc failed: nothing to judge"
    pending = slo_condition(spec.slo, {"configHash": "abc"}, None)
    assert pending is not None and (pending.status, pending.reason) == (None, "Pending")
    perf = {"configHash": "abc", "points": [
        {"role": "candidate", "concurrency": 8, "audioThroughput": 12.0,
         "firstAudioP95Ms": 900.0, "successful": 250, "total": 256}],
        "quality": {"werPercent": 3.0, "sim": 0.7}}
    missed = slo_condition(spec.slo, perf, None)
    assert missed is not None and (missed.status, missed.reason) == (False, "Missed")
    assert missed.message == ("abc: C8: 6 requests failed; C8: audio throughput 12 < 15 "
                              "audio-s/s")
    good = copy.deepcopy(perf)
    good["points"][0] |= {"audioThroughput": 20.0, "successful": 256}
    met = slo_condition(spec.slo, good, None)
    assert met is not None and (met.status, met.reason) == (True, "Met")


def test_events_tell_when_a_search_starts_and_how_it_ended() -> None:
    searching_now = {"phase": "Searching", "message": "0 of 3 candidates done",
                     "candidates": [{}, {}, {}]}
    chosen = {"phase": "Chosen", "message": "Chose x", "winnerConfigHash": "abc"}
    assert [e[1] for e in search_events(None, searching_now)] == ["ProfileSearchStarted"]
    assert search_events(searching_now, dict(searching_now)) == []
    assert search_events(searching_now, chosen) == [("Normal", "ProfileChosen", "Chose x")]
    none = {"phase": "NoCandidateMeetsSlo", "message": "No candidate meets the SLO"}
    assert search_events(chosen, none)[0][:2] == ("Warning", "NoCandidateMeetsSlo")
    assert search_events(none, None) == []
