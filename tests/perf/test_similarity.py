"""Speaker similarity for real: espeak-ng voices and the Resemblyzer d-vector on CPU.

Needs the Debian package `espeak-ng` and the `perf` extra (Resemblyzer, its weights inside
the wheel; nothing is downloaded).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from statistics import fmean

import numpy as np
import pytest
from espeak_speech import (
    SENTENCES,
    VOICES,
    as_server_wav,
    read_pcm16,
    speak,
    write_pcm16,
)
from minicpm_speech_perf import rescore as rs
from minicpm_speech_perf import similarity as sim
from minicpm_speech_perf.quality_audio import SilentWavError

VOICE_NAMES = tuple(VOICES)

# Measured (24 pairs each, 6 voices x 4 sentences, reference 22.05 kHz vs generated 24 kHz):
# same speaker 0.888 mean (min 0.821), different speakers 0.669 mean (max 0.851): a gap of 0.22.
# The gate needs SIM to tell a voice from another, so the gap must stay clearly positive.
MIN_SAME_VS_DIFFERENT_GAP = 0.12


@pytest.fixture(scope="module")
def encoder() -> sim.SpeakerEncoder:
    return sim.default_speaker_encoder()


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], tuple[Path, Path]]:
    """(voice, sentence) -> (espeak's reference WAV, the same speech as the server saves it)."""
    root = tmp_path_factory.mktemp("voices")
    out = {}
    for voice in VOICE_NAMES:
        for i, text in enumerate(SENTENCES):
            raw = speak(root / f"{voice}-{i}-ref.wav", text, voice)
            out[voice, i] = (raw, as_server_wav(raw, root / f"{voice}-{i}-gen.wav"))
    return out


def pairs(*, same: bool) -> list[tuple[str, int, str, int]]:
    """Reference (voice, sentence) against generated (voice, another sentence)."""
    n = len(SENTENCES)
    out = []
    for k, voice in enumerate(VOICE_NAMES):
        for i in range(n):
            other = voice if same else VOICE_NAMES[(k + 1 + i) % len(VOICE_NAMES)]
            out.append((voice, i, other, (i + 1) % n))
    return out


def test_same_speaker_scores_above_different_speakers(
    encoder: sim.SpeakerEncoder, speech: dict[tuple[str, int], tuple[Path, Path]]
) -> None:
    def score(pair: tuple[str, int, str, int]) -> float:
        ref_voice, i, gen_voice, j = pair
        return sim.speaker_similarity(encoder, speech[ref_voice, i][0], speech[gen_voice, j][1])

    same = [score(p) for p in pairs(same=True)]
    different = [score(p) for p in pairs(same=False)]
    assert len(same) >= 20 and len(different) >= 20
    assert all(0.0 <= s <= 1.0 for s in same + different)
    gap = fmean(same) - fmean(different)
    detail = (
        f"same {fmean(same):.3f} (min {min(same):.3f}), "
        f"different {fmean(different):.3f} (max {max(different):.3f}), gap {gap:.3f}"
    )
    print(detail)
    assert gap >= MIN_SAME_VS_DIFFERENT_GAP, detail


def test_identical_speech_is_near_one(
    encoder: sim.SpeakerEncoder, speech: dict[tuple[str, int], tuple[Path, Path]]
) -> None:
    ref, gen = speech[VOICE_NAMES[0], 0]
    assert sim.speaker_similarity(encoder, ref, gen) >= 0.99


def test_embedding_is_unit_length(
    encoder: sim.SpeakerEncoder, speech: dict[tuple[str, int], tuple[Path, Path]]
) -> None:
    audio, _ = rs.load_for_asr(speech[VOICE_NAMES[1], 1][1])
    e = encoder.embed(audio)
    assert e.ndim == 1 and e.size == 256
    assert float(np.linalg.norm(e)) == pytest.approx(1.0, abs=1e-4)
    assert encoder.name.startswith("resemblyzer-0.1.4")


def test_silent_or_empty_wavs_are_refused(
    encoder: sim.SpeakerEncoder, speech: dict[tuple[str, int], tuple[Path, Path]], tmp_path: Path
) -> None:
    ref, gen = speech[VOICE_NAMES[0], 0]
    silent = write_pcm16(tmp_path / "silent.wav", np.zeros(48000, dtype=np.float32), 24000)
    empty = write_pcm16(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32), 24000)
    for reference, generated, bad in ((ref, silent, silent), (silent, gen, silent)):
        with pytest.raises(SilentWavError, match=str(bad)):
            sim.speaker_similarity(encoder, reference, generated)
    with pytest.raises(rs.CorruptWavError, match=str(empty)):
        sim.speaker_similarity(encoder, ref, empty)
    assert issubclass(SilentWavError, rs.WavError)


def test_reference_may_have_any_format_but_generated_must_be_the_servers(
    encoder: sim.SpeakerEncoder, speech: dict[tuple[str, int], tuple[Path, Path]], tmp_path: Path
) -> None:
    ref, gen = speech[VOICE_NAMES[2], 1]
    samples, rate = read_pcm16(ref)
    stereo_48k = rs.resample(samples, rate, 48000)
    stereo = write_pcm16(tmp_path / "stereo.wav", np.repeat(stereo_48k, 2), 48000, channels=2)
    assert sim.speaker_similarity(encoder, stereo, gen) >= 0.98
    with pytest.raises(rs.WavFormatError, match="22050 Hz"):
        sim.speaker_similarity(encoder, stereo, ref)
    assert sim.speaker_similarity(encoder, stereo, ref, allow_resample=True) >= 0.98


def test_importing_the_scorers_loads_no_model_library() -> None:
    code = (
        "import sys\n"
        "import minicpm_speech_perf.similarity, minicpm_speech_perf.naturalness\n"
        "import minicpm_speech_perf.quality_figures\n"
        "heavy = {'torch', 'librosa', 'onnxruntime', 'resemblyzer', 'speechmos'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
