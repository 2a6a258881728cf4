"""The host-half front-ends are bit-identical to the functions the reference calls."""

from __future__ import annotations

import pytest
import torch
from minicpm_speech_runtime.fixtures.synth import voice_like
from minicpm_speech_runtime.voice import dsp

torchaudio = pytest.importorskip("torchaudio")


@pytest.mark.parametrize("rate", [8000, 16000, 22050, 24000, 44100, 48000])
@pytest.mark.parametrize("target", [16000, 24000])
def test_resample_matches_torchaudio(rate: int, target: int) -> None:
    x = torch.from_numpy(voice_like(1.37, rate, rate)).unsqueeze(0)
    ref = torchaudio.transforms.Resample(rate, target)(x)
    assert torch.equal(dsp.resample(x, rate, target), ref)


def test_kaldi_fbank_matches_torchaudio() -> None:
    import torchaudio.compliance.kaldi as kaldi

    x = torch.from_numpy(voice_like(2.3, 16000, 3))
    ref = kaldi.fbank(x.unsqueeze(0), num_mel_bins=80, dither=0, sample_frequency=16000)
    assert torch.equal(dsp.kaldi_fbank_80(x), ref)


def test_s3_log_mel_matches_s3tokenizer() -> None:
    import s3tokenizer

    x = torch.from_numpy(voice_like(2.3, 16000, 4))
    assert torch.equal(dsp.s3_log_mel(x), s3tokenizer.log_mel_spectrogram(x))


def test_prompt_mel_matches_reference() -> None:
    from stepaudio2.flashcosyvoice.utils.audio import mel_spectrogram

    x = torch.from_numpy(voice_like(2.3, 24000, 5)).unsqueeze(0)
    assert torch.equal(dsp.prompt_mel_24k(x), mel_spectrogram(x))
