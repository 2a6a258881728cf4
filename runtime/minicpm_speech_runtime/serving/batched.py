"""How stage 2's connector extras configure this project's engine, and how vLLM-Omni's
prompt features become the engine's voices.

:func:`engine_config` maps the extras onto :class:`EngineConfig` and refuses what the engine
cannot do, with one line naming the key; :func:`voice_from_features` turns vLLM-Omni's
``PromptFeatures`` into a :class:`~minicpm_speech_runtime.voice.device.PreparedVoice`.
:mod:`.backend` drives the engine behind vLLM-Omni's Code2Wav model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from minicpm_speech_contract.extras import Code2WavExtras, first_problem

from ..engine import EngineConfig
from ..voice.device import PreparedVoice

DEFAULT_MAX_STREAMS = 8
# vLLM-Omni ends its requests itself (``on_requests_finished`` drops the state, whose handle
# then cancels the stream), so the engine's idle timeout only backstops a state never let go.
# At the engine's default of 30 s it cut live requests whose next window was merely slow to
# come (a loaded stage 1), and their audio ended early without an error.
IDLE_BACKSTOP_S = 600.0


class UnsupportedOption(ValueError):
    """A connector extra the batched engine cannot honour; the message is one line."""


def engine_config(
    extras: Mapping[str, Any], device: torch.device, max_streams: int | None = None
) -> EngineConfig:
    """The :class:`EngineConfig` of a stage's connector extras; raises :class:`UnsupportedOption`.

    ``micro_batch_size`` -> ``micro_batch``, ``cfm_max_graphs`` -> ``graph_budget``,
    ``cfm_graph_precapture`` -> ``precapture``, ``token2wav_allow_tf32`` -> ``tf32``,
    ``enable_cfm_graph`` -> ``cuda_graphs`` (CUDA only), ``enable_hift_graph`` ->
    ``vocoder_graphs`` (default on), ``token2wav_setup_cache_size`` -> ``setup_cache_voices``
    (0 turns the engine's setup cache off), ``token2wav_n_timesteps`` ->
    ``n_timesteps``, ``token2wav_precision`` -> ``precision``, ``token2wav_cache_mib`` ->
    ``cache_mib``, ``ref_audio_max_seconds`` ->
    ``max_prompt_frames``. ``max_streams`` is the
    stage's ``max_num_seqs``, and bounds ``micro_batch`` too; when the stage does not say, it
    is 8 or ``micro_batch_size`` if larger.
    """
    # the stage's extras are vLLM-Omni's base config merged with the overlay: keys of the
    # base's own (connector_get_max_wait, ...) are vLLM-Omni's, not this check's
    problem = first_problem({**extras, "batched_code2wav": True}, vllm_omni_internal=True,
                            other_keys=True)
    if problem is not None:
        raise UnsupportedOption(problem.line())
    settings = Code2WavExtras.of(extras)
    micro = settings.micro_batch_size
    # the stage's max_num_seqs is the capacity; a setup group never outgrows it
    streams = max_streams if max_streams is not None else max(micro, DEFAULT_MAX_STREAMS)
    micro = min(micro, streams)
    return EngineConfig(
        max_streams=streams,
        max_prompt_frames=settings.max_prompt_frames,
        micro_batch=micro,
        n_timesteps=settings.token2wav_n_timesteps,
        precision=settings.token2wav_precision,
        cache_mib=settings.token2wav_cache_mib,
        tf32=settings.token2wav_allow_tf32,
        cuda_graphs=device.type == "cuda" and settings.enable_cfm_graph,
        precapture=settings.cfm_graph_precapture,
        vocoder_graphs=settings.enable_hift_graph,
        setup_cache_voices=settings.token2wav_setup_cache_size,
        graph_budget=settings.cfm_max_graphs,
        idle_timeout_s=IDLE_BACKSTOP_S,
    )


def voice_from_features(features: Any, device: torch.device) -> PreparedVoice:
    """A :class:`PreparedVoice` of vLLM-Omni's ``PromptFeatures`` (or a voice, returned as is)."""
    if isinstance(features, PreparedVoice):
        return features
    tokens = features.speech_tokens.reshape(1, -1).to(device=device, dtype=torch.long)
    mels = features.mels
    if mels.dim() == 2:
        mels = mels.unsqueeze(0)
    mels = mels.to(device=device, dtype=torch.float32)
    spk = features.speaker_embedding.reshape(1, -1).to(device=device, dtype=torch.float32)
    return PreparedVoice(
        key=repr(getattr(features, "cache_key", id(features))),
        prompt_tokens=tokens,
        prompt_tokens_len=torch.tensor([tokens.shape[1]], dtype=torch.int32, device=device),
        spk_emb=spk,
        prompt_mels=mels,
        prompt_mels_len=torch.tensor([mels.shape[1]], dtype=torch.int32, device=device),
    )
