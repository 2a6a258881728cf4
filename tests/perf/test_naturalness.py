"""Naturalness (MOS) for real: espeak-ng speech, degraded on purpose, scored by DNSMOS P.808.

Needs the Debian package `espeak-ng` and the `perf` extra (speechmos ships the ONNX model;
nothing is downloaded).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from statistics import fmean

import numpy as np
import pytest
from espeak_speech import SENTENCES, as_server_wav, read_pcm16, speak, write_pcm16
from minicpm_speech_perf import naturalness as nat
from minicpm_speech_perf import rescore as rs
from minicpm_speech_perf.quality_audio import SilentWavError

RATE = 24000
CLEAN = (("us-m3", 0), ("gb-f2", 1), ("rp-f5", 2))


def white_noise_10db(x: np.ndarray) -> np.ndarray:
    rms = float(np.sqrt(np.mean(x**2)))
    noise = np.random.default_rng(7).standard_normal(len(x)).astype(np.float32)
    return x + noise * rms / 10 ** (10 / 20)


def hard_clipping(x: np.ndarray) -> np.ndarray:
    # Clipped at a tenth of the peak, then brought back to the same peak: distortion only,
    # not a quieter clip.
    peak = float(np.max(np.abs(x)))
    return np.clip(x, -0.1 * peak, 0.1 * peak) * 10


def played_too_fast(x: np.ndarray) -> np.ndarray:
    # 16 kHz samples saved as 24 kHz: 1.5x the speed and pitch, the error of a vocoder or
    # writer that mixes up its rates.
    return rs.resample(x, RATE, 16000)


def through_8khz(x: np.ndarray) -> np.ndarray:
    # Down to 8 kHz and back: right speed, but nothing above 4 kHz.
    return rs.resample(rs.resample(x, RATE, 8000), 8000, RATE)


# Measured over CLEAN (mean MOS of the 3 utterances; clean 3.46):
#   white noise 10 dB SNR: 2.67 (mean drop 0.79; smallest drop of one utterance 0.59)
#   hard clipping at 10 % of peak: 2.70 (mean drop 0.75; smallest 0.65)
#   16 kHz played at 24 kHz: 3.13 (mean drop 0.33; smallest 0.21)
#   8 kHz round trip: 3.15 (mean drop 0.31; smallest 0.22)
# Each must lower the mean by at least about half its measured drop, and every utterance
# must score lower than its clean version.
DEGRADATIONS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], float]] = {
    "white noise 10 dB SNR": (white_noise_10db, 0.4),
    "hard clipping": (hard_clipping, 0.4),
    "16 kHz played at 24 kHz": (played_too_fast, 0.15),
    "8 kHz round trip": (through_8khz, 0.15),
}


@pytest.fixture(scope="module")
def predictor() -> nat.MosPredictor:
    return nat.default_mos_predictor()


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:
    """(espeak's own 22.05 kHz WAV, the same speech as the server saves it)."""
    root = tmp_path_factory.mktemp("mos")
    out = []
    for voice, i in CLEAN:
        raw = speak(root / f"{voice}-{i}-raw.wav", SENTENCES[i], voice)
        out.append((raw, as_server_wav(raw, root / f"{voice}-{i}.wav")))
    return out


@pytest.fixture(scope="module")
def clean_mos(predictor: nat.MosPredictor, clean: list[tuple[Path, Path]]) -> list[float]:
    return [nat.mos_of_wav(predictor, gen) for _, gen in clean]


def test_clean_speech_scores_as_fair_speech(clean_mos: list[float]) -> None:
    assert all(3.0 <= m <= 4.5 for m in clean_mos), clean_mos


@pytest.mark.parametrize("name", list(DEGRADATIONS))
def test_degradation_lowers_mos(
    name: str,
    predictor: nat.MosPredictor,
    clean: list[tuple[Path, Path]],
    clean_mos: list[float],
    tmp_path: Path,
) -> None:
    degrade, margin = DEGRADATIONS[name]
    degraded = []
    for k, (_, gen) in enumerate(clean):
        samples, rate = read_pcm16(gen)
        wav = write_pcm16(tmp_path / f"{k}.wav", degrade(samples), rate)
        degraded.append(nat.mos_of_wav(predictor, wav))
    drops = [c - d for c, d in zip(clean_mos, degraded, strict=True)]
    detail = f"{name}: clean {fmean(clean_mos):.2f}, degraded {fmean(degraded):.2f}, drops {drops}"
    print(detail)
    assert fmean(drops) >= margin, detail
    assert min(drops) > 0, detail


def test_rate_and_channels_do_not_move_the_score(
    predictor: nat.MosPredictor,
    clean: list[tuple[Path, Path]],
    clean_mos: list[float],
    tmp_path: Path,
) -> None:
    raw = clean[0][0]
    samples, rate = read_pcm16(raw)
    stereo = write_pcm16(tmp_path / "stereo.wav", np.repeat(samples, 2), rate, channels=2)
    assert nat.mos_of_wav(predictor, raw) == pytest.approx(clean_mos[0], abs=0.1)
    assert nat.mos_of_wav(predictor, stereo) == pytest.approx(clean_mos[0], abs=0.1)


def test_same_score_as_the_reference_scoring(
    predictor: nat.MosPredictor, clean: list[tuple[Path, Path]], clean_mos: list[float]
) -> None:
    # speechmos's own DNSMOS pipeline runs the P.835 model too; only its P.808 output is ours.
    from speechmos import dnsmos

    models = Path(dnsmos.__file__).parent / "dnsmos_models"
    reference = dnsmos.DNSMOS(str(models / "sig_bak_ovr.onnx"), str(models / "model_v8.onnx"))
    samples, rate = read_pcm16(clean[1][1])
    audio = np.clip(rs.resample(samples, rate, 16000), -1.0, 1.0)
    expected = float(reference(audio, 16000, False)["p808_mos"])
    assert clean_mos[1] == pytest.approx(expected, abs=1e-4)


def test_silent_and_empty_wavs_are_refused(predictor: nat.MosPredictor, tmp_path: Path) -> None:
    silent = write_pcm16(tmp_path / "silent.wav", np.zeros(RATE * 2, dtype=np.float32), RATE)
    empty = write_pcm16(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32), RATE)
    with pytest.raises(SilentWavError, match=str(silent)):
        nat.mos_of_wav(predictor, silent)
    with pytest.raises(rs.CorruptWavError, match=str(empty)):
        nat.mos_of_wav(predictor, empty)
    assert predictor.name.startswith("dnsmos-p808-speechmos-0.0.1.1")
