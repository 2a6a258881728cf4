"""A stand-in for `vllm bench serve --omni`: parses the protocol's flags and writes a result
file in the official format, as the real client would after a run against the server.

Environment knobs for tests: FAKE_EVENTS (JSON-lines log), FAKE_CLIENT_FAIL_ON (result file
name that makes it exit 3), FAKE_CLIENT_SLEEP (seconds to hang, for timeouts),
FAKE_CLIENT_VOICE (an espeak voice of tests/perf/espeak_speech.py: the saved WAVs are that
voice speaking, not silence, as a server that answers in that voice would leave them),
FAKE_CLIENT_SIM (with SEED_TTS_SIM_EVAL=1: the SIM the evaluator reports for every utterance;
"0" is what an evaluator whose speaker model never ran reports).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
import wave
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from espeak_speech import SENTENCES, as_server_wav, speak
from perf_fixtures import synthetic_run, wer_block, write


def parse(argv: list[str]) -> argparse.Namespace:
    if argv[:3] != ["bench", "serve", "--omni"]:
        raise SystemExit(f"expected 'bench serve --omni', got {argv[:3]}")
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in (
        "--backend",
        "--base-url",
        "--endpoint",
        "--model",
        "--tokenizer",
        "--dataset-name",
        "--dataset-path",
        "--seed-tts-locale",
        "--seed-tts-system-prompt",
        "--seed",
        "--output-len",
        "--num-warmups",
        "--request-rate",
        "--ready-check-timeout-sec",
        "--extra-body",
        "--percentile-metrics",
        "--metric-percentiles",
        "--result-dir",
        "--result-filename",
    ):
        p.add_argument(flag, required=True)
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--max-concurrency", type=int, required=True)
    for flag in (
        "--trust-remote-code",
        "--no-oversample",
        "--disable-shuffle",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
    ):
        p.add_argument(flag, action="store_true", required=False)
    return p.parse_args(argv[3:])


def silent_wav(path: Path) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(24000)
        w.writeframes(b"\x00\x00" * 2400)


def main() -> int:
    args = parse(sys.argv[1:])
    json.loads(args.extra_body)
    with urllib.request.urlopen(args.base_url + "/health", timeout=5) as r:
        server_up = r.status == 200
    env_keys = (
        "SEED_TTS_WER_EVAL",
        "SEED_TTS_WER_SAVE_ITEMS",
        "SEED_TTS_SIM_EVAL",
        "SEED_TTS_UTMOS_EVAL",
        "SEED_TTS_WER_SAVE_AUDIO_DIR",
        "SEED_TTS_HF_WHISPER_MODEL",
        "SEED_TTS_EVAL_DEVICE",
    )
    with open(os.environ["FAKE_EVENTS"], "a", encoding="utf-8") as f:
        f.write(
            json.dumps(
                {
                    "who": "client",
                    "name": args.result_filename,
                    "t": time.time(),
                    "c": args.max_concurrency,
                    "n": args.num_prompts,
                    "server_up": server_up,
                    "env": {k: os.environ.get(k) for k in env_keys},
                }
            )
            + "\n"
        )
    if os.environ.get("FAKE_CLIENT_FAIL_ON") == args.result_filename:
        return 3
    time.sleep(float(os.environ.get("FAKE_CLIENT_SLEEP", "0")))
    doc = synthetic_run(
        args.max_concurrency, n=args.num_prompts, scale=1.1 if "B." in args.result_filename else 1.0
    )
    if os.environ.get("SEED_TTS_WER_EVAL") == "1":
        audio_dir = Path(os.environ["SEED_TTS_WER_SAVE_AUDIO_DIR"])
        audio_dir.mkdir(parents=True, exist_ok=True)
        items = []
        for i in range(args.num_prompts):
            utt = f"utt_{i:03d}"
            wav = audio_dir / f"{i:05d}_{utt}_en.wav"
            voice = os.environ.get("FAKE_CLIENT_VOICE")
            if voice:
                spoken = speak(audio_dir / f"{i:05d}.espeak.wav", SENTENCES[i % len(SENTENCES)],
                               voice)
                as_server_wav(spoken, wav)
                spoken.unlink()
            else:
                silent_wav(wav)
            items.append(
                {
                    "utterance_id": utt,
                    "locale": "en",
                    "wer": 0.02 * (i % 3),
                    "reference_raw": f"sentence number {i}",
                    "asr_raw": "x",
                    "audio_path": str(wav),
                }
            )
        doc |= wer_block(items, audio_dir=str(audio_dir))
        if os.environ.get("SEED_TTS_SIM_EVAL") == "1":
            sim = float(os.environ.get("FAKE_CLIENT_SIM", "0.6"))
            for n, item in enumerate(items):
                item["sim"] = 0.0 if sim == 0 else sim + 0.01 * (n % 3)
            doc |= {"seed_tts_sim_evaluated": len(items),
                    "seed_tts_sim_mean": sum(i["sim"] for i in items) / max(1, len(items))}
    write(Path(args.result_dir) / args.result_filename, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
