"""The CPU overlay of the real-server lane: what it merges over the deploy config the operator
renders for the ``default`` profile (an overlay on vLLM-Omni's own ``minicpmo_4_5_turn.yaml``)
so that the tiny model folder of :mod:`.model_folder` serves on a CPU.

What it changes, and why:

* Thinker and Talker: ``load_format: dummy`` (random weights, no files), ``enforce_eager``, a
  short context, and an explicit KV cache size, which vLLM's CPU worker takes instead of
  reserving ``gpu_memory_utilization`` of the host's memory.
* Thinker and Talker: no image, audio or video input (``limit_mm_per_prompt`` zeros): no
  HuggingFace processor ships offline, and vLLM sizes a multimodal stage's encoder budget with
  it (the Talker shares the Thinker's multimodal model class), so only text is served. A
  reference voice is not multimodal input: it travels in the body's ``ref_audio``.
* The Talker's ``max_tokens`` bounds one reply's audio (25 codec frames a second); at random
  weights its EOS almost never comes, so every reply is that long (75: 3 s). The Thinker's
  ``max_tokens`` (16) bounds the text the Talker is conditioned on.
* Short contexts (Thinker 384 tokens, Talker 416): the perf Jobs send the protocol's body,
  which asks the Thinker for 256 tokens after a prompt of about 85 (the API refuses a prompt
  plus ``max_tokens`` over the context) and the Talker for 2048, and the Talker stops at its
  context's end, after the Thinker's reply it is conditioned on. With 1024 each, one such
  request was 30.8 s of audio in 48.9 s here; these keep it to a few seconds.
* Four streams per stage (the profile's 8 would hold more memory than the lane needs).
* ``async_chunk: true``, as the product's base: Code2Wav decodes while the Talker generates.
* Code2Wav: HiFT and CFM graphs off (no CUDA), CAM++ on onnxruntime, one preparation worker;
  ``batched_code2wav`` stays on from the profile, and graph precapture off from the
  manifest (``graphPrecapture: false``).

No ``dtype``: vLLM builds each stage under its model dtype as torch's default (bfloat16 here),
and stage 2 must come up in float32 all the same, as the plugin makes it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MiB = 1 << 20
NO_MM_INPUT = {"image": 0, "audio": 0, "video": 0}


def base_deploy_path() -> Path:
    """vLLM-Omni's turn-mode deploy config for MiniCPM-o 4.5, as installed."""
    import vllm_omni

    path = Path(vllm_omni.__file__).resolve().parent / "deploy" / "minicpmo_4_5_turn.yaml"
    if not path.is_file():
        raise FileNotFoundError(path)
    return path


def cpu_overlay(
    *,
    max_num_seqs: int = 4,
    talker_max_tokens: int = 75,
    thinker_max_tokens: int = 16,
    reference_prep_workers: int = 1,
    thinker_max_model_len: int = 384,
    talker_max_model_len: int = 416,
) -> dict[str, Any]:
    """What the lane merges over the operator's rendered deploy config (its stages by id)."""
    llm_stage = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": 1024,
        "enforce_eager": True,
        "load_format": "dummy",
        "kv_cache_memory_bytes": 64 * MiB,
        "limit_mm_per_prompt": dict(NO_MM_INPUT),
    }
    return {
        "async_chunk": True,
        "stages": [
            {"stage_id": 0, **llm_stage, "max_model_len": thinker_max_model_len,
             "default_sampling_params": {"max_tokens": thinker_max_tokens}},
            {"stage_id": 1, **llm_stage, "max_model_len": talker_max_model_len,
             "default_sampling_params": {"max_tokens": talker_max_tokens,
                                         "min_tokens": min(25, talker_max_tokens)}},
            {"stage_id": 2, "max_num_seqs": max_num_seqs, "enforce_eager": True,
             "kv_cache_memory_bytes": 16 * MiB},
        ],
        "connectors": {"connector_of_shared_memory": {"extra": {
            "enable_hift_graph": False,
            "enable_cfm_graph": False,
            "micro_batch_size": max_num_seqs,
            "campplus_backend": "onnxruntime",
            "reference_prep_workers": reference_prep_workers,
            "reference_cache_size": 4,
            "token2wav_runtime_prompt_cache_size": max(4, 2 * max_num_seqs),
        }}},
    }
