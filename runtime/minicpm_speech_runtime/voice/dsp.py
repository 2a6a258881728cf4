"""Signal processing of the host half: resampling and the three feature front-ends.

These reproduce, operation for operation, what the reference preparation calls, so that the
results are bit-identical on the CPU (``tests/runtime/test_dsp_parity.py`` checks it):

* ``resample``: ``torchaudio.transforms.Resample`` (windowed-sinc, Hann, width 6, rolloff 0.99,
  kernel computed in float64 and kept as float32);
* ``kaldi_fbank_80``: ``torchaudio.compliance.kaldi.fbank(num_mel_bins=80, dither=0)`` at 16 kHz;
* ``s3_log_mel``: ``s3tokenizer.log_mel_spectrogram`` with its packaged 128-bin filters;
* ``prompt_mel_24k``: ``stepaudio2.flashcosyvoice.utils.audio.mel_spectrogram`` (80 bins,
  n_fft 1920, hop 480, fmax 8 kHz).

They are re-stated here rather than imported because importing ``torchaudio`` (and the
packages that import it at module level) fails on serving images whose torchaudio does not
match torch, and this module must stay importable on worker threads of any process.
"""

from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

S3_RATE = 16_000
PROMPT_RATE = 24_000
_EPS = torch.tensor(torch.finfo(torch.float).eps)


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int) -> tuple[torch.Tensor, int, int, int]:
    gcd = math.gcd(orig, new)
    orig, new = orig // gcd, new // gcd
    width_zeros, rolloff = 6, 0.99
    base = min(orig, new) * rolloff
    width = math.ceil(width_zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    # The phase offsets are float32 before joining the float64 grid, as in torchaudio.
    t = torch.arange(0, -new, -1, dtype=None)[:, None, None] / new + idx
    t *= base
    t = t.clamp_(-width_zeros, width_zeros)
    window = torch.cos(t * math.pi / width_zeros / 2) ** 2
    t *= math.pi
    kernels = torch.where(t == 0, torch.tensor(1.0).to(t), t.sin() / t)
    kernels *= window * (base / orig)
    return kernels.to(torch.float32), width, orig, new


def resample(wave: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """Resample ``wave`` [..., N] from ``orig`` Hz to ``new`` Hz."""
    if orig == new:
        return wave
    kernel, width, orig_r, new_r = _sinc_kernel(orig, new)
    shape = wave.size()
    flat = wave.reshape(-1, shape[-1])
    n_wavs, length = flat.shape
    padded = F.pad(flat, (width, width + orig_r))
    out = F.conv1d(padded[:, None], kernel.to(wave.device), stride=orig_r)
    out = out.transpose(1, 2).reshape(n_wavs, -1)
    target = math.ceil(new_r * length / orig_r)
    return out[..., :target].reshape((*shape[:-1], min(target, out.shape[-1])))


@lru_cache(maxsize=4)
def _kaldi_mel_banks(num_bins: int, padded: int, rate: float) -> torch.Tensor:
    low, high = 20.0, 0.5 * rate

    def mel_scalar(f: float) -> float:
        return 1127.0 * math.log(1.0 + f / 700.0)

    def mel(f: torch.Tensor) -> torch.Tensor:
        return 1127.0 * (1.0 + f / 700.0).log()

    mel_low, mel_high = mel_scalar(low), mel_scalar(high)
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = torch.arange(num_bins).unsqueeze(1)
    left = mel_low + b * delta
    center = mel_low + (b + 1.0) * delta
    right = mel_low + (b + 2.0) * delta
    grid = mel((rate / padded) * torch.arange(padded / 2)).unsqueeze(0)
    up = (grid - left) / (center - left)
    down = (right - grid) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))
    return F.pad(banks, (0, 1), mode="constant", value=0)


@lru_cache(maxsize=4)
def _povey_window(size: int) -> torch.Tensor:
    return torch.hann_window(size, periodic=False, dtype=torch.float32).pow(0.85)


def kaldi_fbank_80(wave_16k: torch.Tensor) -> torch.Tensor:
    """Kaldi-compatible log-mel filterbank [frames, 80] of a mono 16 kHz float32 signal."""
    size, shift, padded = 400, 160, 512
    if wave_16k.shape[0] < size:
        raise ValueError("signal shorter than one 25 ms frame")
    m = 1 + (wave_16k.shape[0] - size) // shift
    frames = wave_16k.as_strided((m, size), (shift * wave_16k.stride(0), wave_16k.stride(0)))
    frames = frames - torch.mean(frames, dim=1).unsqueeze(1)
    shifted = F.pad(frames.unsqueeze(0), (1, 0), mode="replicate").squeeze(0)
    frames = frames - 0.97 * shifted[:, :-1]
    frames = frames * _povey_window(size).to(frames.device).unsqueeze(0)
    frames = F.pad(frames.unsqueeze(0), (0, padded - size), mode="constant", value=0).squeeze(0)
    power = torch.fft.rfft(frames).abs().pow(2.0)
    banks = _kaldi_mel_banks(80, padded, float(S3_RATE)).to(frames.device, frames.dtype)
    energies = torch.mm(power, banks.T)
    return torch.max(energies, _EPS.to(frames.device, frames.dtype)).log()


def _s3_filter_file() -> Path:
    # Located without importing s3tokenizer, whose package imports torchaudio.
    spec = importlib.util.find_spec("s3tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("s3tokenizer is not installed; its mel filters are needed")
    return Path(next(iter(spec.submodule_search_locations))) / "assets" / "mel_filters.npz"


@lru_cache(maxsize=2)
def _s3_filters(n_mels: int) -> torch.Tensor:
    with np.load(_s3_filter_file(), allow_pickle=False) as f:
        return torch.from_numpy(f[f"mel_{n_mels}"])


def s3_log_mel(wave_16k: torch.Tensor, n_mels: int = 128) -> torch.Tensor:
    """Whisper-style log-mel [n_mels, frames] that the S3 tokenizer quantizes."""
    window = torch.hann_window(400).to(wave_16k.device)
    stft = torch.stft(wave_16k, 400, 160, window=window, return_complex=True)
    magnitudes = stft[..., :-1].abs() ** 2
    mel_spec = _s3_filters(n_mels).to(wave_16k.device) @ magnitudes
    log_spec = torch.clamp(mel_spec, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


@lru_cache(maxsize=2)
def _prompt_mel_basis() -> torch.Tensor:
    from librosa.filters import mel as librosa_mel

    basis = librosa_mel(sr=PROMPT_RATE, n_fft=1920, n_mels=80, fmin=0, fmax=8000)
    return torch.from_numpy(basis).float()


def prompt_mel_24k(wave_24k: torch.Tensor) -> torch.Tensor:
    """Log-mel [1, 80, frames] of a [1, N] 24 kHz signal, as the flow's prompt expects."""
    n_fft, hop = 1920, 480
    pad = (n_fft - hop) // 2
    y = F.pad(wave_24k.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    window = torch.hann_window(n_fft).to(y.device)
    spec = torch.view_as_real(
        torch.stft(
            y,
            n_fft,
            hop_length=hop,
            win_length=n_fft,
            window=window,
            center=False,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        )
    )
    spec = torch.sqrt(spec.pow(2).sum(-1) + 1e-9)
    spec = torch.matmul(_prompt_mel_basis().to(y.device), spec)
    return torch.log(torch.clamp(spec, min=1e-5))
