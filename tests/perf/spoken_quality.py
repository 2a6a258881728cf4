"""The quality program run whole against the fake server and client, the client saving
espeak-ng speech in a chosen voice, scored by the real speaker and naturalness models: the
termination message a quality Job would leave. Every utterance's reference voice is
REFERENCE_VOICE."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from espeak_speech import SENTENCES, speak
from fake_env import FAKES, FixedSampler, free_port, server_cmd
from minicpm_speech_perf.config import QualityConfig, parse_quality
from minicpm_speech_perf.procs import SubprocessRunner
from minicpm_speech_perf.wer import VoiceModels, finish_quality, run_quality

REFERENCE_VOICE, OTHER_VOICE = "us-m3", "gb-f2"
PROMPTS = 6


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


def spoken_config(workdir: Path, config_hash: str = "q-1", **over: Any) -> QualityConfig:
    events, port = workdir / "events.jsonl", free_port()
    return parse_quality({
        "config_hash": config_hash,
        "artifacts_dir": str(workdir / "art"),
        "arms": [{"name": "B", "command": server_cmd(events, port, "B", "--ready-after", "0.2")}],
        "client": {"model": "m", "tokenizer": "/t",
                   "dataset_root": str(dataset(workdir / "d")),
                   "command_prefix": [sys.executable, str(FAKES / "fake_client.py")]},
        "server": {"port": port, "poll_s": 0.1, "stop_grace_s": 5},
        "asr": {"whisper_model": "/asr/whisper-large-v3", "device": "cpu"},
        "highest_gated_concurrency": 8,
        "requests": {"measured": PROMPTS, "warmup": 1},
    } | over)


def spoken_quality_message(workdir: Path, voice: str, models: VoiceModels | None = None,
                           config_hash: str = "q-1", **over: Any) -> tuple[int, str]:
    """(exit code, termination message) of a quality run whose server speaks in ``voice``."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = spoken_config(workdir, config_hash, **over)
    saved = {key: os.environ.get(key) for key in ("FAKE_EVENTS", "FAKE_CLIENT_VOICE")}
    os.environ.update(FAKE_EVENTS=str(workdir / "events.jsonl"), FAKE_CLIENT_VOICE=voice)
    try:
        manifest = run_quality(cfg, SubprocessRunner(), lambda: FixedSampler(2.0))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert manifest["status"] == "ok", manifest["reason"]
    return finish_quality(cfg, manifest, voice=models)
