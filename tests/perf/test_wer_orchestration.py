"""The quality run with the fake server and client: warm-up, C8, C1, highest gated C."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_env import FAKES, FixedSampler, free_port, read_events, server_cmd
from minicpm_speech_contract.termination import parse_termination_message
from minicpm_speech_perf.config import ConfigError, QualityConfig, parse_quality
from minicpm_speech_perf.procs import SubprocessRunner
from minicpm_speech_perf.wer import finish_quality, run_quality


class EchoAsr:
    """Transcribes every WAV as its reference text, except for one utterance."""

    def __init__(self, texts: dict[int, str]) -> None:
        self.calls = 0
        self.texts = texts

    def transcribe(self, audio_16k: np.ndarray) -> str:
        assert audio_16k.dtype == np.float32 and len(audio_16k) == 1600  # 0.1 s at 16 kHz
        self.calls += 1
        return self.texts.get(self.calls, "")


def quality_config(tmp_path: Path, events: Path, port: int, **over: Any) -> QualityConfig:
    data: dict[str, Any] = {
        "config_hash": "q-1",
        "artifacts_dir": str(tmp_path / "art"),
        "arms": [{"name": "B", "command": server_cmd(events, port, "B", "--ready-after", "0.2")}],
        "client": {"model": "m", "tokenizer": "/t", "dataset_root": "/d",
                   "command_prefix": [sys.executable, str(FAKES / "fake_client.py")]},
        "server": {"port": port, "poll_s": 0.1, "stop_grace_s": 5},
        "asr": {"whisper_model": "/asr/whisper-large-v3", "device": "cuda:0"},
        "highest_gated_concurrency": 32,
    } | over  # fmt: skip
    return parse_quality(data)


def test_quality_run_keeps_wavs_and_reports_both_evaluators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("FAKE_EVENTS", str(events))
    port = free_port()
    meta = tmp_path / "d" / "en" / "meta.lst"
    meta.parent.mkdir(parents=True)
    meta.write_text("".join(f"utt_{i:03d}|p|prompts/utt_{i:03d}.wav|sentence number {i}\n"
                            for i in range(64)))
    cfg = quality_config(tmp_path, events, port, client={
        "model": "m", "tokenizer": "/t", "dataset_root": str(tmp_path / "d"),
        "command_prefix": [sys.executable, str(FAKES / "fake_client.py")]})
    manifest = run_quality(cfg, SubprocessRunner(), lambda: FixedSampler(2.0))
    assert manifest["status"] == "ok", manifest["reason"]

    ev = read_events(events)
    server = [e["event"] for e in ev if e["who"] == "server"]
    assert server == ["start", "ready", "sigterm", "exit"]
    clients = [e for e in ev if e["who"] == "client"]
    assert [(e["name"], e["c"], e["n"]) for e in clients] == [
        ("B.1-warmup.json", 16, 16),
        ("quality-c8.json", 8, 64),
        ("quality-c1.json", 1, 64),
        ("quality-c32.json", 32, 64),
    ]
    assert clients[0]["env"]["SEED_TTS_WER_EVAL"] == "0"
    root = cfg.sweep.artifacts_dir
    for e in clients[1:]:
        env = e["env"]
        assert env["SEED_TTS_WER_EVAL"] == "1" and env["SEED_TTS_WER_SAVE_ITEMS"] == "1"
        assert env["SEED_TTS_EVAL_DEVICE"] == "cuda:0"
        assert env["SEED_TTS_HF_WHISPER_MODEL"] == "/asr/whisper-large-v3"
        assert env["SEED_TTS_WER_SAVE_AUDIO_DIR"] == str(root / "wavs" / f"c{e['c']}")
        assert len(list((root / "wavs" / f"c{e['c']}").glob("*.wav"))) == 64

    # Re-scorer: right for utterance 1 of each C, empty (WER 1) for the rest.
    asr = EchoAsr({1: "sentence number 0", 65: "sentence number 0", 129: "sentence number 0"})
    rc, message = finish_quality(cfg, manifest, asr)
    assert rc == 0 and asr.calls == 3 * 64
    msg = parse_termination_message(message)
    assert msg["kind"] == "wer" and msg["hash"] == "q-1"
    assert [w["c"] for w in msg["wer"]] == [8, 1, 32]
    first = msg["wer"][0]
    assert (first["done"], first["judged"], first["n"]) == (64, 64, 64)
    assert first["wer"] == pytest.approx(np.mean([0.02 * (i % 3) for i in range(64)]), rel=1e-3)
    assert first["rescored"] == pytest.approx(63 / 64, rel=1e-3)
    # The fake saves silence and no prompt exists: nothing to score, so no figure, not a 0.
    assert (first["sim"], first["sim_n"], first["mos"], first["mos_n"]) == (None, 0, None, 0)
    report = json.loads((root / "rescore-c8.json").read_text())
    assert report["judged"] == 64 and report["items"][0]["wer"] == 0.0
    summary = json.loads((root / "wer_summary.json").read_text())
    assert summary["rows"][0]["wav_dir"] == "wavs/c8"
    assert "SIM is missing for every utterance" in summary["rows"][0]["sim_error"]


def test_quality_failure_is_a_failed_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("FAKE_EVENTS", str(events))
    monkeypatch.setenv("FAKE_CLIENT_FAIL_ON", "quality-c1.json")
    port = free_port()
    cfg = quality_config(tmp_path, events, port, highest_gated_concurrency=8)
    manifest = run_quality(cfg, SubprocessRunner(), lambda: FixedSampler(2.0))
    assert manifest["status"] == "failed"
    rc, message = finish_quality(cfg, manifest, asr=None)
    msg = parse_termination_message(message)
    assert rc == 1 and "quality-c1: client exited with code 3" in msg["reason"]
    assert [w["c"] for w in msg["wer"]] == [8]  # what was measured is still reported
    assert msg["wer"][0]["rescored"] is None


def test_missing_rescore_model_fails_with_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("FAKE_EVENTS", str(events))
    port = free_port()
    cfg = quality_config(tmp_path, events, port, highest_gated_concurrency=1,
                         rescore={"model": str(tmp_path / "no-model")})  # fmt: skip
    manifest = run_quality(cfg, SubprocessRunner(), lambda: FixedSampler(2.0))
    rc, message = finish_quality(cfg, manifest)
    msg = parse_termination_message(message)
    assert rc == 1 and "no-model" in msg["reason"]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"asr": {}}, "asr.whisper_model"),
        ({"asr": {"whisper_model": "/m", "device": "tpu"}}, "device"),
        ({"highest_gated_concurrency": 12}, "highest_gated_concurrency"),
        ({"rescore": {"device": "cpu"}}, "rescore.model"),
        ({"arms": [{"name": "A", "command": ["a"]}, {"name": "B", "command": ["b"]}]}, "arms"),
    ],
)
def test_quality_config_errors(tmp_path: Path, change: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        quality_config(tmp_path, tmp_path / "e", 8091, **change)
