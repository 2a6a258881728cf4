"""The quality program measures speaker similarity and naturalness on the speech a server
saved, against each utterance's reference prompt: a server that answers in another voice
keeps its WER and loses its SIM, and the operator's gate sees it.

The fake client saves espeak-ng speech in a chosen voice; the models are the real ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from espeak_speech import SENTENCES, speak
from fake_env import FixedSampler, free_port, read_events
from minicpm_speech_contract.termination import parse_termination_message
from minicpm_speech_operator.perf.gate import quality_verdict
from minicpm_speech_operator.spec import Gate
from minicpm_speech_perf.procs import SubprocessRunner
from minicpm_speech_perf.wer import VoiceModels, finish_quality, run_quality
from test_wer_orchestration import quality_config

REFERENCE_VOICE, OTHER_VOICE = "us-m3", "gb-f2"
PROMPTS = 6
GATE = Gate((8,), max_throughput_loss_percent=5, max_first_audio_p95_rise_percent=10,
            max_wer_percent=6, max_wer_increase_points=1, max_sim_drop=0.01, max_mos_drop=0.05)


@pytest.fixture(scope="module")
def voice_models() -> VoiceModels:
    return VoiceModels.default()


def dataset(root: Path) -> Path:
    """meta.lst and prompt WAVs: each utterance's reference voice is REFERENCE_VOICE."""
    prompts = root / "en" / "prompts"
    prompts.mkdir(parents=True)
    rows = []
    for i in range(PROMPTS):
        prompt_text = SENTENCES[(i + 1) % len(SENTENCES)]
        speak(prompts / f"utt_{i:03d}.wav", prompt_text, REFERENCE_VOICE)
        rows.append(f"utt_{i:03d}|{prompt_text}|prompts/utt_{i:03d}.wav|"
                    f"{SENTENCES[i % len(SENTENCES)]}")
    (root / "en" / "meta.lst").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def quality_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, voice: str,
                    models: VoiceModels) -> dict[str, Any]:
    monkeypatch.setenv("FAKE_EVENTS", str(tmp_path / "events.jsonl"))
    monkeypatch.setenv("FAKE_CLIENT_VOICE", voice)
    port = free_port()
    client = {"model": "m", "tokenizer": "/t", "dataset_root": str(dataset(tmp_path / "d"))}
    cfg = quality_config(tmp_path, tmp_path / "events.jsonl", port, highest_gated_concurrency=8,
                         requests={"measured": PROMPTS, "warmup": 1},
                         client={**client, "command_prefix": quality_client_prefix()})
    manifest = run_quality(cfg, SubprocessRunner(), lambda: FixedSampler(2.0))
    assert manifest["status"] == "ok", manifest["reason"]
    rc, message = finish_quality(cfg, manifest, voice=models)
    assert rc == 0, message
    return parse_termination_message(message)


def quality_client_prefix() -> list[str]:
    import sys

    from fake_env import FAKES
    return [sys.executable, str(FAKES / "fake_client.py")]


@pytest.mark.timeout(600)
def test_a_server_answering_in_another_voice_keeps_its_wer_and_fails_sim(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, voice_models: VoiceModels) -> None:
    same = quality_message(tmp_path / "same", monkeypatch, REFERENCE_VOICE, voice_models)
    other = quality_message(tmp_path / "other", monkeypatch, OTHER_VOICE, voice_models)
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
    msg = quality_message(tmp_path, monkeypatch, REFERENCE_VOICE, voice_models)
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
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, voice_models: VoiceModels) -> None:
    """The fake's default is silence: nothing to score, so SIM and MOS are null, never 0, and
    the gate fails on them by name."""
    monkeypatch.delenv("FAKE_CLIENT_VOICE", raising=False)
    monkeypatch.setenv("FAKE_EVENTS", str(tmp_path / "events.jsonl"))
    client = {"model": "m", "tokenizer": "/t", "dataset_root": str(dataset(tmp_path / "d")),
              "command_prefix": quality_client_prefix()}
    cfg = quality_config(tmp_path, tmp_path / "events.jsonl", free_port(),
                         highest_gated_concurrency=1, requests={"measured": 2, "warmup": 1},
                         client=client)
    manifest = run_quality(cfg, SubprocessRunner(), lambda: FixedSampler(2.0))
    rc, message = finish_quality(cfg, manifest, voice=voice_models)
    msg = parse_termination_message(message)
    assert rc == 0 and msg["wer"][0]["sim"] is None and msg["wer"][0]["sim_n"] == 0
    verdict = quality_verdict(GATE, msg, None, "nothing")
    assert not verdict.passed and "SIM was not measured" in verdict.message
    assert "MOS was not measured" in verdict.message


def official_sim_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     sim: str) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("FAKE_EVENTS", str(events))
    monkeypatch.setenv("FAKE_CLIENT_VOICE", REFERENCE_VOICE)
    monkeypatch.setenv("FAKE_CLIENT_SIM", sim)
    client = {"model": "m", "tokenizer": "/t", "dataset_root": str(dataset(tmp_path / "d")),
              "command_prefix": quality_client_prefix()}
    cfg = quality_config(tmp_path, events, free_port(), highest_gated_concurrency=1,
                         requests={"measured": 3, "warmup": 1}, client=client,
                         similarity={"speaker_model": "/asr/wavlm-sv"})
    manifest = run_quality(cfg, SubprocessRunner(), lambda: FixedSampler(2.0))
    # What the Job loads for this config: no speaker encoder of its own, the MOS predictor.
    rc, message = finish_quality(cfg, manifest)
    return rc, parse_termination_message(message), read_events(events)


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
