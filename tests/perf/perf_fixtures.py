"""Result documents in the format `vllm bench serve --omni --save-result --save-detailed` writes.

Key set and arithmetic follow the client: vLLM's run header merged with vLLM-Omni's
multimodal metrics; `audio_throughput` = total audio seconds / duration; percentile keys
`p{P}_{metric}{suffix}` exist only when the metric has samples; failed requests count in
`failed`, carry an error string and contribute no audio; quality runs add `seed_tts_*`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PERCENTILES = (50, 95, 99)


def _stats(name: str, suffix: str, values: Sequence[float], scale: float) -> dict[str, Any]:
    arr = np.asarray(values, dtype=float)
    out = {
        f"mean_{name}{suffix}": float(np.mean(arr)) * scale,
        f"median_{name}{suffix}": float(np.median(arr)) * scale,
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}{suffix}"] = float(np.percentile(arr, p)) * scale
    return out


def official_result(
    *,
    concurrency: int,
    audio_s: Sequence[float],
    ttfp_s: Sequence[float],
    duration: float,
    failed: int = 0,
    num_prompts: int | None = None,
    model: str = "openbmb/MiniCPM-o-4_5",
    error: str = "ClientPayloadError: Response payload is not completed",
) -> dict[str, Any]:
    """One run: `audio_s` and `ttfp_s` per successful request; `failed` more that failed."""
    ok = len(audio_s)
    assert len(ttfp_s) == ok
    n = ok + failed if num_prompts is None else num_prompts
    e2el = [t + a * 0.35 for t, a in zip(ttfp_s, audio_s, strict=True)]
    rtf = [lat / a for lat, a in zip(e2el, audio_s, strict=True)]
    text_tokens = [int(a * 3.2) for a in audio_s]
    result: dict[str, Any] = {
        "date": "20261129-120000",
        "endpoint_type": "openai-chat-omni",
        "backend": "openai-chat-omni",
        "label": None,
        "model_id": model,
        "tokenizer_id": "/models/MiniCPM-o-4_5",
        "num_prompts": n,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": concurrency,
        "duration": duration,
        "completed": ok,
        "failed": failed,
        "total_input_tokens": 41 * n,
        "total_output_tokens": sum(text_tokens),
        "request_throughput": ok / duration,
        "request_goodput": None,
        "output_throughput": sum(text_tokens) / duration,
        "total_token_throughput": (41 * n + sum(text_tokens)) / duration,
        "total_audio_duration_s": float(sum(audio_s)),
        "total_audio_frames": int(sum(audio_s) * 24000),
        "audio_throughput": float(sum(audio_s)) / duration,
        "total_images": 0,
        "image_throughput": 0.0,
        "average_pixels_per_image": 0.0,
        "mean_denoise_step_latency_ms": 0.0,
        "total_video_duration_s": 0,
        "total_video_frames": 0,
        "video_throughput": 0.0,
        "mean_video_rtf": 0.0,
        "median_video_rtf": 0.0,
        "percentiles_video_rtf": [[p, 0.0] for p in PERCENTILES],
        "mean_video_generation_ms": 0.0,
        "median_video_generation_ms": 0.0,
        "percentiles_video_generation_ms": [[p, 0.0] for p in PERCENTILES],
        "mean_peak_memory_mb": 0.0,
        "median_peak_memory_mb": 0.0,
        "percentiles_peak_memory_mb": [[p, 0.0] for p in PERCENTILES],
        "stage_durations_mean": {},
        "stage_durations_p50": {},
        "stage_durations_p99": {},
        "input_lens": [41] * n,
        "start_times": [1000.0 + i * 0.01 for i in range(n)],
        "output_lens": text_tokens + [0] * (n - ok),
        "ttfts": [t * 0.4 for t in ttfp_s] + [0.0] * (n - ok),
        "itls": [[0.02] * max(k - 1, 0) for k in text_tokens] + [[] for _ in range(n - ok)],
        "generated_texts": ["Sure."] * ok + [""] * (n - ok),
        "errors": [""] * ok + [error] * (n - ok),
        "max_output_tokens_per_s": 120.0,
        "max_concurrent_requests": concurrency,
        "rtfx": 0.0,
        "num_ttft_samples": ok,
        "num_tpot_samples": ok,
        "num_itl_samples": ok,
        "num_audio_ttfp_samples": ok,
        "num_audio_rtf_samples": ok,
    }
    if ok:
        result |= _stats("ttft", "_ms", [t * 0.4 for t in ttfp_s], 1000.0)
        result |= _stats("tpot", "_ms", [0.02] * ok, 1000.0)
        result |= _stats("itl", "_ms", [0.02] * ok, 1000.0)
    result |= _stats("e2el", "_ms", e2el or [0.0], 1000.0)
    if ok:
        result |= _stats("audio_ttfp", "_ms", ttfp_s, 1000.0)
        result |= _stats("audio_rtf", "", rtf, 1.0)
        result |= _stats("audio_duration", "_s", audio_s, 1.0)
    return result


def wer_block(
    items: Sequence[dict[str, Any]], *, audio_dir: str | None, failed: int = 0
) -> dict[str, Any]:
    """The `seed_tts_*` keys of a quality run; `items` as SEED_TTS_WER_SAVE_ITEMS writes them."""
    wers = [i["wer"] for i in items if "wer" in i]
    block: dict[str, Any] = {
        "seed_tts_eval_protocol": "seed-tts-eval",
        "seed_tts_session_count": len(items),
        "seed_tts_turn_count": len(items),
        "seed_tts_content_evaluated": len(wers),
        "seed_tts_content_error_mean": float(np.mean(wers)) if wers else None,
        "seed_tts_content_error_median": float(np.median(wers)) if wers else None,
        "seed_tts_request_failed": failed,
        "seed_tts_no_pcm": 0,
        "seed_tts_asr_failed": 0,
        "seed_tts_content_metric": "wer",
        "seed_tts_sim_evaluated": 0,
        "seed_tts_sim_mean": None,
        "seed_tts_sim_median": None,
        "seed_tts_sim_failed": 0,
        "seed_tts_sim_skipped_no_ref": 0,
        "seed_tts_utmos_evaluated": 0,
        "seed_tts_utmos_mean": None,
        "seed_tts_utmos_median": None,
        "seed_tts_utmos_failed": 0,
        "seed_tts_saved_audio": sum(1 for i in items if i.get("audio_path")),
        "seed_tts_save_audio_failed": 0,
        "seed_tts_wer_eval_items": list(items),
    }
    if audio_dir is not None:
        block["seed_tts_save_audio_dir"] = audio_dir
    return block


def synthetic_run(
    concurrency: int, *, scale: float = 1.0, failed: int = 0, n: int = 64
) -> dict[str, Any]:
    """A plausible run whose throughput grows with concurrency, deterministic per inputs."""
    ok = n - failed
    audio = [4.0 + (i % 7) * 0.5 for i in range(ok)]
    ttfp = [0.3 + 0.03 * concurrency + (i % 5) * 0.01 for i in range(ok)]
    duration = sum(audio) / (8.0 * concurrency**0.5 * scale)
    return official_result(
        concurrency=concurrency, audio_s=audio, ttfp_s=ttfp, duration=duration, failed=failed,
        num_prompts=n,
    )  # fmt: skip


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    # json.dump as the client does: NaN would be written as NaN, never replaced.
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path
