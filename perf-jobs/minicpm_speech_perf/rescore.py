"""An independent WER re-scorer for the WAVs a quality run saved.

It shares nothing with the official evaluator but the idea: its own text normalisation, its
own ASR (faster-whisper / CTranslate2 instead of transformers), WER from `jiwer`. A quality
verdict that both agree on does not hinge on one evaluator's quirks.
"""

from __future__ import annotations

import re
import unicodedata
import wave
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any, Protocol

import jiwer
import numpy as np

EXPECTED_RATE = 24000
ASR_RATE = 16000


class WavError(ValueError):
    """A WAV that cannot be scored; the message starts with its path."""


class MissingWavError(WavError):
    pass


class CorruptWavError(WavError):
    pass


class WavFormatError(WavError):
    pass


class AsrModelError(RuntimeError):
    """The ASR model folder is missing or not a CTranslate2 Whisper model."""


@dataclass(frozen=True, slots=True)
class WavInfo:
    path: str
    sample_rate: int
    channels: int
    sample_width: int
    frames: int

    @property
    def is_expected_format(self) -> bool:
        return (self.sample_rate, self.channels, self.sample_width) == (EXPECTED_RATE, 1, 2)


def inspect_wav(path: Path) -> WavInfo:
    """Header check: a RIFF/WAVE PCM file with at least one frame."""
    if not path.is_file():
        raise MissingWavError(f"{path}: WAV file not found")
    try:
        with wave.open(str(path), "rb") as w:
            info = WavInfo(
                str(path), w.getframerate(), w.getnchannels(), w.getsampwidth(), w.getnframes()
            )
    except (wave.Error, EOFError) as exc:
        raise CorruptWavError(f"{path}: not a readable PCM WAV ({exc})") from None
    if info.frames == 0:
        raise CorruptWavError(f"{path}: WAV has no audio frames")
    return info


def load_for_asr(path: Path, *, allow_resample: bool = False) -> tuple[np.ndarray, WavInfo]:
    """Float32 mono 16 kHz samples for the ASR, from a 24 kHz mono PCM16 WAV.

    Other rates, channel counts or widths are refused unless `allow_resample`, so a
    misconfigured run that saved the wrong format is noticed instead of scored.
    """
    info = inspect_wav(path)
    if not info.is_expected_format and not allow_resample:
        raise WavFormatError(
            f"{path}: expected {EXPECTED_RATE} Hz mono PCM16, got {info.sample_rate} Hz, "
            f"{info.channels} channel(s), {8 * info.sample_width}-bit"
            " (allow resampling to score it)"
        )
    samples = read_mono(path, info)
    return resample(samples, info.sample_rate, ASR_RATE), info


def read_mono(path: Path, info: WavInfo | None = None) -> np.ndarray:
    """Float32 mono samples at the file's own rate (channels averaged), any PCM width;
    ``info`` when the header was already inspected."""
    info = info or inspect_wav(path)
    with wave.open(str(path), "rb") as w:
        raw = w.readframes(info.frames)
    if len(raw) < info.frames * info.channels * info.sample_width:
        raise CorruptWavError(f"{path}: WAV data is shorter than its header says")
    try:
        samples = _to_float(raw, info.sample_width)
    except WavFormatError as exc:
        raise WavFormatError(f"{path}: {exc}") from None
    mono: np.ndarray = samples.reshape(-1, info.channels).mean(axis=1)
    return mono


def _to_float(raw: bytes, width: int) -> np.ndarray:
    if width == 1:
        return (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    if width == 2:
        return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    if width == 4:
        return np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    raise WavFormatError(f"unsupported sample width {8 * width}-bit")


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    """Band-limited resampling through the spectrum (exact for these clip lengths)."""
    if src == dst:
        return x.astype(np.float32)
    n_out = max(1, round(len(x) * dst / src))
    spec = np.fft.rfft(x.astype(np.float64))
    keep = n_out // 2 + 1
    out_spec = np.zeros(keep, dtype=np.complex128)
    m = min(keep, len(spec))
    out_spec[:m] = spec[:m]
    return (np.fft.irfft(out_spec, n=n_out) * (n_out / len(x))).astype(np.float32)


_DASHES = re.compile(r"[\u2010-\u2015\-/]")
_NOT_WORD = re.compile(r"[^\w\s']")


def normalize_text(text: str) -> str:
    """Lower-case words; punctuation dropped, dashes split words, inner apostrophes kept."""
    t = unicodedata.normalize("NFKC", text).lower()
    t = t.replace("\u2019", "'").replace("\u2018", "'")
    t = _DASHES.sub(" ", t)
    t = _NOT_WORD.sub(" ", t).replace("_", " ")
    words = [w.strip("'") for w in t.split()]
    return " ".join(w for w in words if w)


@dataclass(frozen=True, slots=True)
class WerScore:
    wer: float
    reference_words: int
    substitutions: int
    deletions: int
    insertions: int


def word_error_rate(reference: str, hypothesis: str) -> WerScore:
    ref = normalize_text(reference)
    hyp = normalize_text(hypothesis)
    if not ref:
        raise ValueError(f"reference has no words after normalisation: {reference!r}")
    out = jiwer.process_words(ref, hyp)
    n = out.hits + out.substitutions + out.deletions
    return WerScore(float(out.wer), n, out.substitutions, out.deletions, out.insertions)


class Transcriber(Protocol):
    def transcribe(self, audio_16k: np.ndarray) -> str: ...


class WhisperTranscriber:
    """faster-whisper over a local CTranslate2 model folder; never downloads."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        compute_type: str = "int8",
        beam_size: int = 5,
        cpu_threads: int = 0,
    ) -> None:
        path = Path(model_dir)
        if not (path / "model.bin").is_file():
            raise AsrModelError(f"{path}: no CTranslate2 Whisper model (model.bin) here")
        from faster_whisper import WhisperModel

        self.beam_size = beam_size
        self.model = WhisperModel(
            str(path),
            device="cuda" if device.startswith("cuda") else device,
            device_index=int(device.split(":")[1]) if device.startswith("cuda:") else 0,
            compute_type=compute_type,
            cpu_threads=cpu_threads,
            local_files_only=True,
        )

    def transcribe(self, audio_16k: np.ndarray) -> str:
        segments, _ = self.model.transcribe(
            audio_16k,
            language="en",
            beam_size=self.beam_size,
            temperature=0.0,
            condition_on_previous_text=False,
            vad_filter=False,
        )
        return " ".join(s.text.strip() for s in segments).strip()


@dataclass(frozen=True, slots=True)
class Item:
    utterance_id: str
    wav: Path
    reference: str


@dataclass(frozen=True, slots=True)
class ItemScore:
    utterance_id: str
    wav: str
    reference: str
    hypothesis: str | None = None
    wer: float | None = None
    error: str | None = None
    resampled_from: int | None = None


@dataclass(frozen=True, slots=True)
class RescoreReport:
    mean_wer: float | None
    judged: int
    failed: int
    items: tuple[ItemScore, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        return {
            "mean_wer": self.mean_wer,
            "judged": self.judged,
            "failed": self.failed,
            "items": [
                {k: getattr(i, k) for k in ItemScore.__dataclass_fields__} for i in self.items
            ],
        }


def score_item(item: Item, asr: Transcriber, *, allow_resample: bool = False) -> ItemScore:
    """Score one WAV; a bad WAV becomes a named error on the item, not an exception."""
    try:
        audio, info = load_for_asr(item.wav, allow_resample=allow_resample)
    except WavError as exc:
        return ItemScore(item.utterance_id, str(item.wav), item.reference,
                         error=f"{type(exc).__name__}: {exc}")  # fmt: skip
    hyp = asr.transcribe(audio)
    score = word_error_rate(item.reference, hyp)
    resampled = None if info.is_expected_format else info.sample_rate
    return ItemScore(item.utterance_id, str(item.wav), item.reference, hyp, score.wer,
                     resampled_from=resampled)  # fmt: skip


def rescore(
    items: Sequence[Item], asr: Transcriber, *, allow_resample: bool = False
) -> RescoreReport:
    """Mean per-request WER over the items that could be scored (as the official one)."""
    scores = tuple(score_item(i, asr, allow_resample=allow_resample) for i in items)
    wers = [s.wer for s in scores if s.wer is not None]
    return RescoreReport(
        mean_wer=fmean(wers) if wers else None,
        judged=len(wers),
        failed=len(scores) - len(wers),
        items=scores,
    )
