"""Parity helpers shared by the engine tests and the GPU benchmark: fixed NSF noise, a narrow
vocoder for CPU tests, voices, utterances, the reference's whole-utterance streaming, drains."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..assets import Code2WavModels
from ..engine import Code2WavEngine, EngineConfig
from ..fixtures.synth import wav_bytes
from ..voice.device import DeviceHalf, PreparedVoice
from ..voice.host import prepare_host
from ..voice.speaker import make_speaker

TOL = 1e-4


class _FixedNoiseTorch:
    """HiFT's NSF source draws random phases and noise; both sides draw zeros instead."""

    def __getattr__(self, name: str) -> object:
        return getattr(torch, name)

    @staticmethod
    def rand(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros(*args, **kwargs)

    @staticmethod
    def randn_like(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.zeros_like(x)


@contextlib.contextmanager
def fixed_nsf_noise() -> Iterator[None]:
    import stepaudio2.flashcosyvoice.modules.hifigan_components.layers as layers

    saved = layers.torch
    layers.torch = _FixedNoiseTorch()
    try:
        yield
    finally:
        layers.torch = saved


def narrow_hift() -> torch.nn.Module:
    """The reference's HiFT at 32 channels (same 480x up-sampling, caches and source path)."""
    from stepaudio2.flashcosyvoice.modules.hifigan import ConvRNNF0Predictor, HiFTGenerator

    torch.manual_seed(3)
    hift: torch.nn.Module = HiFTGenerator(
        base_channels=32,
        resblock_kernel_sizes=[3],
        resblock_dilation_sizes=[[1]],
        f0_predictor=ConvRNNF0Predictor(cond_channels=32),
    ).eval()
    return hift


def small_models(models: Code2WavModels) -> Code2WavModels:
    """The tiny flow with a narrow HiFT."""
    return dataclasses.replace(models, hift=narrow_hift())


def make_voices(models: Code2WavModels, seconds: list[float]) -> list[PreparedVoice]:
    dev = models.device
    speaker = make_speaker(
        "torch" if dev.type == "cuda" else "onnxruntime", models.campplus, models.campplus_onnx, dev
    )
    half = DeviceHalf(models.tokenizer, speaker, dev)
    return [
        half.run(prepare_host(wav_bytes(s, 16000, seed=i), models.up_rate))
        for i, s in enumerate(seconds)
    ]


def utterance(n: int, seed: int) -> list[int]:
    return torch.randint(0, 6561, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def reference_chunks(
    driver: Any, sid: Any, voice: PreparedVoice, tokens: list[int]
) -> list[np.ndarray]:
    """The reference's streaming of one whole utterance: 25 + 3 lookahead per chunk, the last
    chunk the remainder (up to 25 + 3), as the engine chunks it."""
    driver.add(sid, voice)
    out = []
    while len(tokens) > 28:
        out.append(driver.stream(sid, tokens[:28], False))
        tokens = tokens[25:]
    out.append(driver.stream(sid, tokens, True))
    driver.remove(sid)
    return out


def engine(models: Code2WavModels, **kw: Any) -> Code2WavEngine:
    cfg = dict(max_streams=6, max_prompt_frames=300, micro_batch=4, tf32=False)
    cfg.update(kw)
    return Code2WavEngine(models, EngineConfig(**cfg))  # type: ignore[arg-type]


def drain(
    eng: Code2WavEngine,
    out: dict[Any, list[np.ndarray]],
    reasons: dict[Any, str],
    min_steps: int = 1,
) -> Iterator[int]:
    """Step until no stream is left (at least ``min_steps`` steps); yields each step number."""
    step = 0
    while eng.num_streams or step < min_steps:
        yield step
        step_once(eng, out, reasons)
        step += 1


def step_once(eng: Code2WavEngine, out: dict[Any, list[np.ndarray]],
              reasons: dict[Any, str]) -> None:
    """One engine step; each stream's PCM goes to ``out``, a finished one's reason to
    ``reasons``."""
    for o in eng.step():
        if o.pcm.numel():
            out.setdefault(o.stream_id, []).append(o.pcm.numpy())
        if o.finished:
            reasons[o.stream_id] = o.reason or ""


def max_diff(want: list[np.ndarray], got: list[np.ndarray]) -> float:
    assert [w.shape for w in want] == [g.shape for g in got]
    return max(float(np.abs(w - g).max()) for w, g in zip(want, got, strict=True))
