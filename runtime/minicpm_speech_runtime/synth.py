"""Synthetic reference voices for tests and benchmarks (no data sets needed)."""

from __future__ import annotations

from typing import cast

import numpy as np

from .wav import encode_wav_pcm16


def voice_like(seconds: float, rate: int, seed: int) -> np.ndarray:
    """A voiced-sounding random signal: harmonics of a wandering pitch, syllable-rate
    amplitude changes and a little noise, peaking at 0.3."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = rng.uniform(90, 250) * (1 + 0.1 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t))
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 8))
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * rng.uniform(1, 4) * t) ** 2)
    x = x + 0.02 * rng.standard_normal(n)
    return cast(np.ndarray, (0.3 * x / np.abs(x).max()).astype(np.float32))


def wav_bytes(seconds: float = 1.0, rate: int = 16000, seed: int = 0) -> bytes:
    """Mono 16-bit WAV bytes of :func:`voice_like`."""
    return encode_wav_pcm16(voice_like(seconds, rate, seed), rate)
