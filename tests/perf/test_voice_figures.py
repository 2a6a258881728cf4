"""The quality program measures speaker similarity and naturalness on the speech a server
saved, against each utterance's reference prompt: a server that answers in another voice
keeps its WER and loses its SIM, and the operator's gate sees it.

The fake client saves espeak-ng speech in a chosen voice; the models are the real ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_env import read_events
from minicpm_speech_contract.termination import parse_termination_message
from minicpm_speech_operator.perf.gate import quality_verdict
from minicpm_speech_operator.spec import parse_spec
from minicpm_speech_perf.wer import VoiceModels
from spoken_quality import (
    OTHER_VOICE,
    PROMPTS,
    REFERENCE_VOICE,
    spoken_quality_message,
)

from tests.controller.builders import claim_spec

# The gate a resource gets by default: SIM may drop 0.01, MOS 0.05.
GATE = parse_spec(claim_spec()).perf.gate


@pytest.fixture(scope="module")
def voice_models() -> VoiceModels:
    return VoiceModels.default()


def quality_message(tmp_path: Path, voice: str, models: VoiceModels) -> dict[str, Any]:
    rc, message = spoken_quality_message(tmp_path, voice, models)
    assert rc == 0, message
    return parse_termination_message(message)


@pytest.mark.timeout(600)
def test_a_server_answering_in_another_voice_keeps_its_wer_and_fails_sim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, voice_models: VoiceModels) -> None:
    same = quality_message(tmp_path / "same", REFERENCE_VOICE, voice_models)
    other = quality_message(tmp_path / "other", OTHER_VOICE, voice_models)
    for msg in (same, other):
        assert msg["sim_model"] == voice_models.speaker.name
        assert msg["mos_model"] == voice_models.naturalness.name
        assert [w["c"] for w in msg["wer"]] == [8, 1]
        for entry in msg["wer"]:
            assert entry["sim_n"] == entry["mos_n"] == PROMPTS
            assert 1.0 <= entry["mos_p10"] <= entry["mos"] <= 5.0
            assert entry["sim_p10"] <= entry["sim"]
    print(f"\nSIM same voice {same['wer'][0]['sim']}, other voice {other['wer'][0]['sim']}; "
          f"MOS {same['wer'][0]['mos']} / {other['wer'][0]['mos']}")
    assert [w["wer"] for w in same["wer"]] == [w["wer"] for w in other["wer"]]
    assert other["wer"][0]["sim"] < same["wer"][0]["sim"] - 0.05
    verdict = quality_verdict(GATE, other, same, "last good g")
    assert not verdict.passed and "C8: SIM" in verdict.message and "WER" not in verdict.message
    assert quality_verdict(GATE, same, same, "last good g").passed


def test_the_report_shows_each_concurrencys_figures_and_their_spread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, voice_models: VoiceModels) -> None:
    msg = quality_message(tmp_path, REFERENCE_VOICE, voice_models)
    root = tmp_path / "art"
    summary = json.loads((root / "wer_summary.json").read_text())
    report = (root / "quality.md").read_text()
    for row, entry in zip(summary["rows"], msg["wer"], strict=True):
        assert f"| {row['concurrency']} | " in report
        assert f"| {row['sim']:.3f} | {row['sim_p10']:.3f} | {row['mos']:.2f} |" in report
        assert entry["sim"] == pytest.approx(row["sim"], rel=1e-3)
    assert f"SIM by {voice_models.sim_model}, MOS by {voice_models.naturalness.name}" in report
    assert (root / "quality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = json.loads((root / "quality_plot.json").read_text())
    for row in summary["rows"]:
        c = str(row["concurrency"])
        assert drawn["sim"]["series"][c] == list(row["sim_items"].values())
        assert len(drawn["mos"]["series"][c]) == row["mos_n"] == PROMPTS


def test_silent_speech_leaves_the_figures_unmeasured_with_the_reason(
        tmp_path: Path, voice_models: VoiceModels) -> None:
    """No voice: the fake saves silence, nothing can be scored, so SIM and MOS are null,
    never 0, and the gate fails on them by name."""
    rc, message = spoken_quality_message(tmp_path, "", voice_models, highest_gated_concurrency=1,
                                         requests={"measured": 2, "warmup": 1})
    msg = parse_termination_message(message)
    assert rc == 0 and msg["wer"][0]["sim"] is None and msg["wer"][0]["sim_n"] == 0
    verdict = quality_verdict(GATE, msg, None, "nothing")
    assert not verdict.passed and "SIM was not measured" in verdict.message
    assert "MOS was not measured" in verdict.message


def official_sim_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     sim: str) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """With a speaker model in the config, and the Job's own choice of models for it."""
    monkeypatch.setenv("FAKE_CLIENT_SIM", sim)
    rc, message = spoken_quality_message(
        tmp_path, REFERENCE_VOICE, None, highest_gated_concurrency=1,
        requests={"measured": 3, "warmup": 1}, similarity={"speaker_model": "/asr/wavlm-sv"})
    return rc, parse_termination_message(message), read_events(tmp_path / "events.jsonl")


def test_with_a_speaker_model_given_sim_is_the_official_evaluators(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rc, msg, events = official_sim_run(tmp_path, monkeypatch, "0.6")
    quality_runs = [e for e in events if e["who"] == "client" and e["env"]["SEED_TTS_WER_EVAL"]
                    == "1"]
    assert quality_runs and all(e["env"]["SEED_TTS_SIM_EVAL"] == "1" for e in quality_runs)
    assert rc == 0 and msg["sim_model"] == "seed-tts-wavlm:wavlm-sv"
    assert msg["wer"][0]["sim"] == pytest.approx(0.61) and msg["wer"][0]["sim_n"] == 3
    assert msg["wer"][0]["mos_n"] == 3  # naturalness still from the built-in predictor


def test_the_evaluators_silent_zero_fails_the_job_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rc, msg, _ = official_sim_run(tmp_path, monkeypatch, "0")
    assert rc == 1 and msg["status"] == "failed"
    assert "seed_tts_sim_mean" in msg["reason"] and "did not run" in msg["reason"]
