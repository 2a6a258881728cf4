"""The regression gate's arithmetic, and how a finished Job's evidence is judged."""

from __future__ import annotations

from typing import Any

import pytest
from minicpm_speech_operator.perf.gate import perf_verdict, quality_verdict
from minicpm_speech_operator.perf.results import (
    Attempt,
    attempt_of,
    job_state,
    kind_state,
    read_result,
)
from minicpm_speech_operator.spec import Gate

from .perf_builders import sweep_text, wer_text

GATE = Gate((8,), max_throughput_loss_percent=5, max_first_audio_p95_rise_percent=10,
            max_wer_percent=6, max_wer_increase_points=1, max_sim_drop=0.01, max_mos_drop=0.05)
MODELS = {"sim_model": "resemblyzer-0.1.4", "mos_model": "distillmos-0.9.1"}


def p(tput: float, p95: float = 1000.0, ok: int = 256) -> dict[str, Any]:
    return {"c": 8, "tput": tput, "ttfp_p95_ms": p95, "ok": ok, "n": 256}


@pytest.mark.parametrize(("candidate", "baseline", "passed", "words"), [
    (p(24.0), p(25.0), True, "-4.0 %"),
    (p(23.0), p(25.0), False, "-8.0 %, limit -5 %"),
    (p(25.0, 1120.0), p(25.0, 1000.0), False, "+12.0 %, limit +10 %"),
    (p(25.0, ok=250), p(25.0), False, "6 of 256 requests failed"),
    (p(25.0), None, True, "no last good"),
])
def test_perf_gate(candidate: dict[str, Any], baseline: dict[str, Any] | None, passed: bool,
                   words: str) -> None:
    verdict = perf_verdict(GATE, [candidate], [baseline] if baseline else None, "last good x")
    assert verdict.passed is passed and words in verdict.message
    assert verdict.reason == ("Regressed" if not passed else
                              "NoBaseline" if baseline is None else "WithinLimits")


def test_a_gated_concurrency_without_a_number_fails() -> None:
    assert not perf_verdict(GATE, [{"c": 8, "tput": None, "ok": 0, "n": 256}], None, "x").passed


def entry(wer: float = 0.03, sim: float | None = 0.72, mos: float | None = 3.9,
          **extra: Any) -> dict[str, Any]:
    return {"c": 8, "wer": wer, "judged": 64, "n": 64, "sim": sim, "sim_p10": sim,
            "sim_n": 64, "mos": mos, "mos_p10": mos, "mos_n": 64, **extra}


def result(*entries: dict[str, Any], **models: str) -> dict[str, Any]:
    return {"wer": list(entries), **MODELS, **models}


@pytest.mark.parametrize(("wer", "old", "passed", "words"), [
    (0.03, None, True, "WER 3.00 %"),
    (0.07, None, False, "limit 6 %"),
    (0.045, 0.03, False, "+1.50 points"),
    (0.035, 0.03, True, "+0.50 points"),
])
def test_quality_gate(wer: float, old: float | None, passed: bool, words: str) -> None:
    last = result(entry(old)) if old is not None else None
    verdict = quality_verdict(GATE, result(entry(wer)), last, "last good x")
    assert verdict.passed is passed and words in verdict.message


def test_an_unjudged_quality_run_fails() -> None:
    verdict = quality_verdict(GATE, result({"c": 8, "wer": None, "judged": 0, "n": 64}), None,
                              "x")
    assert not verdict.passed and "no request was judged" in verdict.message


@pytest.mark.parametrize(("candidate", "old", "passed", "words"), [
    (entry(sim=0.70), entry(sim=0.72), False, "SIM 0.700 vs 0.720 last good x (-0.020, "
                                              "limit -0.01)"),
    (entry(sim=0.715), entry(sim=0.72), True, "SIM 0.715 vs 0.720"),
    (entry(mos=3.80), entry(mos=3.90), False, "MOS 3.80 vs 3.90 last good x (-0.10, "
                                              "limit -0.05)"),
    (entry(mos=3.88), entry(mos=3.90), True, "MOS 3.88"),
    (entry(sim=0.80, mos=4.2), entry(), True, "SIM 0.800 vs 0.720 last good x (+0.080"),
])
def test_similarity_and_naturalness_against_the_last_good(
        candidate: dict[str, Any], old: dict[str, Any], passed: bool, words: str) -> None:
    verdict = quality_verdict(GATE, result(candidate), result(old), "last good x")
    assert verdict.passed is passed and words in verdict.message, verdict.message


@pytest.mark.parametrize(("candidate", "words"), [
    (entry(sim=None), "SIM was not measured"),
    (entry(mos=None), "MOS was not measured"),
    (entry(sim=0.0), "SIM is exactly 0"),
    (entry(sim_n=0), "SIM was not measured"),
    ({"c": 8, "wer": 0.03, "judged": 64, "n": 64}, "SIM was not measured"),  # an older Job
])
def test_a_figure_missing_or_zero_fails_even_without_a_baseline(
        candidate: dict[str, Any], words: str) -> None:
    verdict = quality_verdict(GATE, result(candidate), None, "nothing")
    assert not verdict.passed and words in verdict.message


def test_figures_of_different_models_are_never_compared() -> None:
    verdict = quality_verdict(GATE, result(entry(sim=0.30), sim_model="wavlm-sv"),
                              result(entry(sim=0.72)), "last good x")
    assert verdict.passed
    assert "SIM 0.300 by wavlm-sv, not compared with last good x's by resemblyzer" in (
        verdict.message)


def job(state: str, *, reason: str = "", kind: str = "sweep", attempt: int = 1) -> dict[str, Any]:
    conditions = {"active": [], "ok": [{"type": "Complete", "status": "True"}],
                  "failed": [{"type": "Failed", "status": "True", "reason": reason}]}[state]
    return {"metadata": {"name": f"s-{kind}-h-{attempt}", "uid": "u", "labels": {
        "serving.minicpm-speech.io/config-hash": "h",
        "serving.minicpm-speech.io/perf-kind": kind,
        "serving.minicpm-speech.io/perf-attempt": str(attempt)}},
        "spec": {"backoffLimit": 0}, "status": {"conditions": conditions}}


def pod(message: str | None, reason: str | None = None) -> dict[str, Any]:
    terminated = {"exitCode": 0, **({"message": message} if message is not None else {})}
    return {"metadata": {"name": "p"}, "status": {**({"reason": reason} if reason else {}),
            "containerStatuses": [{"name": "perf", "state": {"terminated": terminated}}]}}


def attempt(state: str, **kw: Any) -> Attempt:
    found = attempt_of(job(state, **kw))
    assert found is not None
    return found


def test_job_state_reads_conditions_then_counts() -> None:
    assert job_state(job("ok")) == ("succeeded", "")
    assert job_state(job("failed", reason="DeadlineExceeded")) == ("failed", "DeadlineExceeded")
    assert job_state({"spec": {"backoffLimit": 1}, "status": {"failed": 2}}) == (
        "failed", "BackoffLimitExceeded")
    assert job_state({"status": {"active": 1}}) == ("active", "")
    assert attempt_of({"metadata": {"name": "foreign", "labels": {}}}) is None


@pytest.mark.parametrize(("state", "job_reason", "the_pod", "reason"), [
    ("ok", "", pod(sweep_text("h", 20.0)), ""),
    ("ok", "", pod("{not json"), "MalformedResult"),
    ("ok", "", pod(sweep_text("other", 20.0)), "MalformedResult"),
    ("ok", "", pod(wer_text("h", 0.03)), "MalformedResult"),  # a WER result from a sweep Job
    ("ok", "", pod(None), "NoResult"),
    ("ok", "", None, "NoResult"),
    ("failed", "BackoffLimitExceeded", pod(None), "JobFailed"),
    ("failed", "DeadlineExceeded", pod(None), "DeadlineExceeded"),
    ("failed", "BackoffLimitExceeded", pod(None, "Evicted"), "Evicted"),
])
def test_read_result(state: str, job_reason: str, the_pod: dict[str, Any] | None,
                     reason: str) -> None:
    result = read_result(attempt(state, reason=job_reason), the_pod)
    assert result.reason == reason
    assert (result.doc is not None) is (reason == "")


def test_a_failed_run_reports_the_programs_own_reason() -> None:
    from minicpm_speech_perf.summarize import sweep_message
    text = sweep_message({"config_hash": "h", "mode": "dedicated", "status": "failed",
                          "reason": "server B1 exited with code 1",
                          "started": "2026-11-29T10:00:00Z", "finished": "2026-11-29T10:05:00Z"},
                         [])
    result = read_result(attempt("failed", reason="BackoffLimitExceeded"), pod(text))
    assert result.reason == "RunFailed" and "server B1 exited" in result.message


def test_retries_are_bounded_and_counted() -> None:
    first = attempt("failed", reason="BackoffLimitExceeded")
    results = {first.name: read_result(first, pod(None))}
    retrying = kind_state("sweep", [first], results, max_attempts=2)
    assert retrying.state == "Retrying" and retrying.next_attempt == 2
    second = attempt("failed", reason="DeadlineExceeded", attempt=2)
    results[second.name] = read_result(second, pod(None))
    done = kind_state("sweep", [first, second], results, max_attempts=2)
    assert done.state == "Failed" and done.next_attempt is None
    assert done.reason == "DeadlineExceeded" and "2/2" in done.message
