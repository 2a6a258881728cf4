"""WAVs as the speech-quality models (SIM, MOS) read them: mono float32, silence refused.

A model fed silence still returns a number (a cosine, a MOS), and that number would look like
a measurement. Silence is therefore refused here, by name, before any model sees it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .rescore import WavError, inspect_wav, load_for_asr, read_mono

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


def read_speech(path: Path) -> tuple[np.ndarray, int]:
    """Mono samples at the file's own rate (`rescore.read_mono`), refusing a silent WAV with
    SilentWavError."""
    info = inspect_wav(path)
    samples = read_mono(path, info)
    _refuse_silence(path, samples)
    return samples, info.sample_rate


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
