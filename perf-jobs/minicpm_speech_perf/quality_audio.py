"""WAVs as the speech-quality models (SIM, MOS) read them: mono float32, silence refused.

A model fed silence still returns a number (a cosine, a MOS), and that number would look like
a measurement. Silence is therefore refused here, by name, before any model sees it.
"""

from __future__ import annotations

import math
import wave
from pathlib import Path

import numpy as np

from .rescore import (
    CorruptWavError,
    WavError,
    WavFormatError,
    inspect_wav,
    load_for_asr,
    pcm_to_float,
)

# Quieter than any speech a TTS server returns, louder than PCM16 dither (-90 dBFS).
SILENCE_PEAK_DBFS = -60.0


class SilentWavError(WavError):
    """A WAV with no speech to score: digital silence, or nothing a voice detector accepts."""


class NoSpeechError(ValueError):
    """Audio handed to a model has no speech in it; callers name the WAV it came from."""


def peak_dbfs(samples: np.ndarray) -> float:
    peak = float(np.max(np.abs(samples))) if samples.size else 0.0
    return 20 * math.log10(peak) if peak > 0 else -math.inf


def check_speech(samples: np.ndarray) -> None:
    """Raise NoSpeechError for empty, non-finite or silent audio."""
    if samples.size == 0:
        raise NoSpeechError("no samples")
    if not np.all(np.isfinite(samples)):
        raise NoSpeechError("samples are not all finite")
    level = peak_dbfs(samples)
    if level < SILENCE_PEAK_DBFS:
        raise NoSpeechError(f"silent (peak {level:.1f} dBFS, below {SILENCE_PEAK_DBFS:.0f} dBFS)")


def read_mono(path: Path) -> tuple[np.ndarray, int]:
    """Float32 mono samples at the file's own rate (channels averaged), any PCM width."""
    info = inspect_wav(path)
    with wave.open(str(path), "rb") as w:
        raw = w.readframes(info.frames)
    if len(raw) < info.frames * info.channels * info.sample_width:
        raise CorruptWavError(f"{path}: WAV data is shorter than its header says")
    try:
        samples = pcm_to_float(raw, info.sample_width)
    except WavFormatError as exc:
        raise WavFormatError(f"{path}: {exc}") from None
    return samples.reshape(-1, info.channels).mean(axis=1), info.sample_rate


def read_speech(path: Path) -> tuple[np.ndarray, int]:
    """`read_mono`, refusing a silent WAV with SilentWavError."""
    samples, rate = read_mono(path)
    _refuse_silence(path, samples)
    return samples, rate


def load_speech_16k(path: Path, *, allow_resample: bool) -> np.ndarray:
    """Mono 16 kHz samples as the re-scorer loads them; silence refused.

    Without `allow_resample` only the server's format (24 kHz mono PCM16) is accepted, as in
    `rescore.load_for_asr`.
    """
    samples, _ = load_for_asr(path, allow_resample=allow_resample)
    _refuse_silence(path, samples)
    return samples


def _refuse_silence(path: Path, samples: np.ndarray) -> None:
    try:
        check_speech(samples)
    except NoSpeechError as exc:
        raise SilentWavError(f"{path}: {exc}") from None
