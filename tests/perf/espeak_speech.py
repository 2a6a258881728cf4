"""Speech for the quality-model tests, made on the spot by espeak-ng (Debian package).

Each voice is an espeak language voice, a variant and a pitch: different formant sets, so a
speaker model hears different speakers. Nothing is downloaded.
"""

from __future__ import annotations

import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
from minicpm_speech_perf.rescore import resample

SERVER_RATE = 24000

# name -> (espeak voice+variant, pitch 0-99)
VOICES: dict[str, tuple[str, int]] = {
    "us-m3": ("en-us+m3", 40),
    "gb-f2": ("en-gb+f2", 60),
    "us-f4": ("en-us+f4", 70),
    "scot-m7": ("en-gb-scotland+m7", 30),
    "carib-m1": ("en-029+m1", 50),
    "rp-f5": ("en-gb-x-rp+f5", 55),
}

SENTENCES = (
    "The weather is nice today, so we will walk to the park.",
    "She opened the window and looked at the garden.",
    "I would like a cup of coffee with milk, please.",
    "Our train leaves at seven, so we should hurry.",
)


def require_espeak() -> str:
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.fail("espeak-ng is not installed: apt-get install -y espeak-ng")
    return espeak


def speak(path: Path, text: str, voice: str) -> Path:
    """espeak-ng's own WAV (22.05 kHz mono PCM16), as a reference prompt might come."""
    name, pitch = VOICES[voice]
    cmd = [require_espeak(), "-v", name, "-p", str(pitch), "-s", "150", "-w", str(path), text]
    subprocess.run(cmd, check=True, capture_output=True)
    return path


def read_pcm16(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path), "rb") as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32)
        return data / 32768.0, w.getframerate()


def write_pcm16(path: Path, samples: np.ndarray, rate: int, channels: int = 1) -> Path:
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def as_server_wav(raw: Path, path: Path) -> Path:
    """The same speech as the server saves it: 24 kHz mono PCM16."""
    samples, rate = read_pcm16(raw)
    return write_pcm16(path, resample(samples, rate, SERVER_RATE), SERVER_RATE)
