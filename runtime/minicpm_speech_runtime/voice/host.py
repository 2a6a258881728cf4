"""Host half of reference preparation: WAV bytes to CPU feature tensors.

No device calls and no model state, so it is safe on any worker thread. Together with
:mod:`.device` it yields exactly what the reference's one-shot ``Token2wav._prepare_prompt``
yields for the same file.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import dsp
from .wav import BadReference, DecodedAudio, decode_wav


@dataclass(frozen=True, slots=True)
class HostFeatures:
    """CPU tensors of one reference voice, ready for the device half."""

    key: str  # content hash of the normalised audio
    s3_mel: torch.Tensor  # [1, 128, T] float32
    s3_mel_len: torch.Tensor  # [1] int32
    fbank: torch.Tensor  # [1, T', 80] float32, mean-normalised over time
    prompt_mel: torch.Tensor  # [1, up_rate * n_tokens, 80] float32, replicate-padded
    prompt_mel_len: int  # frames before padding
    n_tokens: int

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.s3_mel, self.fbank, self.prompt_mel))


def token_count(mel_frames: int) -> int:
    """Tokens the S3 tokenizer v2 emits for ``mel_frames`` frames (two stride-2 convs)."""
    once = (mel_frames - 1) // 2 + 1
    return (once - 1) // 2 + 1


def features_from_audio(audio: DecodedAudio, up_rate: int = 2) -> HostFeatures:
    wave = torch.from_numpy(audio.samples.copy()).unsqueeze(0)  # [1, N]
    wave_16k = dsp.resample(wave, audio.sample_rate, dsp.S3_RATE)[0]
    s3_mel = dsp.s3_log_mel(wave_16k)
    n_tokens = token_count(s3_mel.shape[1])
    fbank = dsp.kaldi_fbank_80(wave_16k)
    fbank = fbank - fbank.mean(dim=0, keepdim=True)
    wave_24k = dsp.resample(wave.mean(dim=0, keepdim=True), audio.sample_rate, dsp.PROMPT_RATE)
    mel = dsp.prompt_mel_24k(wave_24k).transpose(1, 2)  # [1, T24, 80]
    mel_len = mel.shape[1]
    target = n_tokens * up_rate
    if target < 1 or mel_len < 1:
        raise BadReference("too-short", "no complete frame after resampling")
    mel = F.pad(mel, (0, 0, 0, target - mel_len), mode="replicate")
    return HostFeatures(
        key=audio.content_hash(),
        s3_mel=s3_mel.unsqueeze(0),
        s3_mel_len=torch.tensor([s3_mel.shape[1]], dtype=torch.int32),
        fbank=fbank.unsqueeze(0),
        prompt_mel=mel,
        prompt_mel_len=mel_len,
        n_tokens=n_tokens,
    )


def prepare_host(data: bytes, up_rate: int = 2) -> HostFeatures:
    """Decode, validate and featurise one reference WAV held in memory."""
    return features_from_audio(decode_wav(data), up_rate)
