"""Official result files are read exactly, and a file not understood is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from minicpm_speech_perf.results import ResultFormatError, parse_run, parse_wer
from perf_fixtures import official_result, synthetic_run, wer_block, write

FIXTURES = Path(__file__).parent / "fixtures"


def test_parse_a_successful_run() -> None:
    doc = json.loads((FIXTURES / "official-c8-ok.json").read_text())
    r = parse_run(FIXTURES / "official-c8-ok.json", expect_concurrency=8)
    assert (r.completed, r.failed, r.num_prompts, r.concurrency) == (64, 0, 64, 8)
    assert r.audio_throughput == pytest.approx(doc["total_audio_duration_s"] / doc["duration"])
    assert r.mean_ttfp_ms == doc["mean_audio_ttfp_ms"]
    assert r.p95_ttfp_ms == doc["p95_audio_ttfp_ms"]
    assert r.mean_rtf == doc["mean_audio_rtf"]
    assert r.errors == ()


def test_parse_a_run_with_failed_requests() -> None:
    r = parse_run(FIXTURES / "official-c8-failed.json")
    assert (r.completed, r.failed, r.ttfp_samples) == (61, 3, 61)
    assert r.errors == ("ClientPayloadError: Response payload is not completed",)


def test_parse_a_run_where_every_request_failed() -> None:
    r = parse_run(FIXTURES / "official-c8-all-failed.json")
    assert (r.completed, r.failed) == (0, 64)
    assert r.mean_ttfp_ms is None and r.p95_ttfp_ms is None and r.mean_rtf is None
    assert r.audio_throughput == 0.0
    assert r.errors == ("Server disconnected",)


def _mutated(tmp_path: Path, change: dict[str, Any], drop: tuple[str, ...] = ()) -> Path:
    doc = synthetic_run(8)
    doc.update(change)
    for key in drop:
        del doc[key]
    return write(tmp_path / "bad-run.json", doc)


@pytest.mark.parametrize(
    ("change", "drop", "key"),
    [
        ({}, ("audio_throughput",), "audio_throughput"),
        ({}, ("num_audio_ttfp_samples",), "num_audio_ttfp_samples"),
        ({}, ("p95_audio_ttfp_ms",), "p95_audio_ttfp_ms"),
        ({}, ("mean_audio_rtf",), "mean_audio_rtf"),
        ({}, ("errors",), "errors"),
        ({}, ("backend", "endpoint_type"), "backend"),
        ({"backend": "openai-chat"}, (), "backend"),
        ({"audio_throughput": "12.5"}, (), "audio_throughput"),
        ({"duration": float("nan")}, (), "duration"),
        ({"completed": -1}, (), "completed"),
        ({"failed": 5}, (), "completed"),
        ({"max_concurrency": 16}, (), "max_concurrency"),
        ({"errors": ["x"]}, (), "errors"),
    ],
)
def test_refused_naming_file_and_key(
    tmp_path: Path, change: dict[str, Any], drop: tuple[str, ...], key: str
) -> None:
    path = _mutated(tmp_path, change, drop)
    with pytest.raises(ResultFormatError) as err:
        parse_run(path, expect_concurrency=8)
    assert err.value.key == key
    assert str(path) in str(err.value) and repr(key) in str(err.value)


@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]"])
def test_refused_when_not_a_json_object(tmp_path: Path, text: str) -> None:
    path = tmp_path / "broken.json"
    path.write_text(text)
    with pytest.raises(ResultFormatError, match=r"broken\.json"):
        parse_run(path)


def test_wer_block_of_a_quality_run(tmp_path: Path) -> None:
    items: list[dict[str, Any]] = [
        {"utterance_id": "u1", "locale": "en", "wer": 0.0, "reference_raw": "Hi there.",
         "asr_raw": "Hi there", "audio_path": "/a/00000_u1_en.wav"},
        {"utterance_id": "u2", "locale": "en", "wer": 0.25, "reference_raw": "A b c d.",
         "asr_raw": "A b c", "audio_path": "/a/00001_u2_en.wav"},
        {"utterance_id": "u3", "locale": "en", "error": "request_failed", "detail": "boom"},
    ]  # fmt: skip
    doc = official_result(concurrency=8, audio_s=[2.0, 3.0], ttfp_s=[0.3, 0.4], duration=2.0,
                          failed=1) | wer_block(items, audio_dir="/a", failed=1)  # fmt: skip
    w = parse_wer(write(tmp_path / "quality-c8.json", doc))
    assert w.mean_wer == pytest.approx(0.125)
    assert (w.evaluated, w.request_failed, w.saved_audio) == (2, 1, 2)
    assert [i.utterance_id for i in w.items] == ["u1", "u2", "u3"]
    assert w.items[2].error == "request_failed"


def test_wer_refused_without_items_or_on_setup_error(tmp_path: Path) -> None:
    doc = synthetic_run(8) | wer_block([], audio_dir=None)
    del doc["seed_tts_wer_eval_items"]
    with pytest.raises(ResultFormatError, match="seed_tts_wer_eval_items"):
        parse_wer(write(tmp_path / "q.json", doc))
    doc = synthetic_run(8) | {"seed_tts_eval_setup_error": "needs jiwer"}
    with pytest.raises(ResultFormatError, match="seed_tts_eval_setup_error"):
        parse_wer(write(tmp_path / "q.json", doc))
    with pytest.raises(ResultFormatError, match="seed_tts_content_metric"):
        parse_wer(write(tmp_path / "q.json", synthetic_run(8)))


def quality_doc(**sim: Any) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"utterance_id": "u1", "locale": "en", "wer": 0.0, "reference_raw": "Hi there.",
         "asr_raw": "Hi there", "audio_path": "/a/00000_u1_en.wav", "sim": 0.61}]
    return (official_result(concurrency=8, audio_s=[2.0], ttfp_s=[0.3], duration=2.0)
            | wer_block(items, audio_dir="/a") | sim)


def test_the_evaluators_own_similarity_is_read_with_its_count(tmp_path: Path) -> None:
    w = parse_wer(write(tmp_path / "q.json", quality_doc(
        seed_tts_sim_mean=0.61, seed_tts_sim_evaluated=1)))
    assert (w.sim_mean, w.sim_evaluated, w.items[0].sim) == (0.61, 1, 0.61)
    off = parse_wer(write(tmp_path / "q.json", quality_doc(seed_tts_sim_mean=None)))
    assert (off.sim_mean, off.sim_evaluated) == (None, 0)


@pytest.mark.parametrize("sim", [
    {"seed_tts_sim_mean": 0.0, "seed_tts_sim_evaluated": 64},  # the silent 0
    {"seed_tts_sim_mean": 0, "seed_tts_sim_evaluated": 0},
    {"seed_tts_sim_mean": 0.6},  # a mean of nothing
])
def test_a_similarity_that_only_looks_measured_is_refused(tmp_path: Path,
                                                          sim: dict[str, Any]) -> None:
    with pytest.raises(ResultFormatError, match=r"seed_tts_sim_mean.*speaker model did not run"):
        parse_wer(write(tmp_path / "q.json", quality_doc(**sim)))


def test_an_utterance_similarity_that_is_not_a_cosine_is_refused(tmp_path: Path) -> None:
    doc = quality_doc()
    doc["seed_tts_wer_eval_items"][0]["sim"] = 3.0
    with pytest.raises(ResultFormatError, match=r"seed_tts_wer_eval_items\[0\]\.sim"):
        parse_wer(write(tmp_path / "q.json", doc))
