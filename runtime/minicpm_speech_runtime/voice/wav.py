"""Decode and validate reference-voice WAV files without torchaudio.

Serving images lack torchcodec, which ``torchaudio.load`` needs from torchaudio 2.9 on, so the
RIFF container is parsed here with ``struct`` and NumPy. Samples are scaled the way libsndfile
(the reference's ``soundfile`` backend) scales them, so PCM input decodes to the same floats.

Every refusal is a :class:`BadReference` whose ``reason`` is a stable short code and whose
message says what was wrong; the caller fails only that request.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

# Bounds on accepted references. The S3 tokenizer encodes up to 30 s in one window and longer
# prompts make every chunk's attention more expensive, so 30 s is the ceiling; below 0.5 s the
# tokenizer yields too few tokens (25 Hz) to describe a voice.
MIN_SECONDS = 0.5
MAX_SECONDS = 30.0
MIN_SAMPLE_RATE = 8_000
MAX_SAMPLE_RATE = 192_000
# Peak below about -80 dBFS counts as silence: nothing to take a voice from.
SILENCE_PEAK = 1e-4
# A reference file larger than this is refused before it is decoded: 30 s of 48 kHz 64-bit
# float is 11.5 MB, so no accepted voice needs more.
MAX_BYTES = 16 * 1024 * 1024

_FORMAT_PCM = 0x0001
_FORMAT_FLOAT = 0x0003
_FORMAT_EXTENSIBLE = 0xFFFE
# Sub-format GUIDs of WAVE_FORMAT_EXTENSIBLE end with this fixed tail.
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"


class BadReference(ValueError):
    """A reference voice that cannot be used; ``reason`` is a short machine-readable code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"bad reference audio ({reason}): {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    """Mono float32 samples in [-1, 1] at the file's own rate."""

    samples: np.ndarray  # [N] float32
    sample_rate: int

    @property
    def seconds(self) -> float:
        samples: int = self.samples.shape[0]
        return samples / self.sample_rate

    def content_hash(self) -> str:
        """Hash of the normalised audio: equal samples hash equal whatever the container."""
        digest = hashlib.sha256(struct.pack("<I", self.sample_rate))
        digest.update(np.ascontiguousarray(self.samples, dtype="<f4").tobytes())
        return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class _Format:
    tag: int
    channels: int
    sample_rate: int
    block_align: int
    bits: int


def _chunks(data: bytes) -> dict[bytes, bytes]:
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise BadReference("corrupt", "not a RIFF/WAVE file")
    found: dict[bytes, bytes] = {}
    pos = 12
    while pos + 8 <= len(data):
        cid, size = struct.unpack_from("<4sI", data, pos)
        body = data[pos + 8 : pos + 8 + size]
        if len(body) < size:
            if cid != b"data":
                raise BadReference("truncated", f"chunk {cid!r} ends early")
            raise BadReference(
                "truncated", f"data chunk declares {size} bytes but {len(body)} are present"
            )
        found.setdefault(cid, body)
        pos += 8 + size + (size & 1)
    return found


def _parse_format(fmt: bytes) -> _Format:
    if len(fmt) < 16:
        raise BadReference("corrupt", "fmt chunk shorter than 16 bytes")
    tag, channels, rate, _, block_align, bits = struct.unpack_from("<HHIIHH", fmt)
    if tag == _FORMAT_EXTENSIBLE:
        if len(fmt) < 40 or fmt[26:40] != _GUID_TAIL:
            raise BadReference("unsupported-encoding", "unknown WAVE_FORMAT_EXTENSIBLE sub-format")
        tag = struct.unpack_from("<H", fmt, 24)[0]
    if channels == 0 or rate == 0 or bits == 0:
        raise BadReference("corrupt", "fmt chunk has zero channels, rate or bit depth")
    if block_align != channels * ((bits + 7) // 8):
        raise BadReference("corrupt", f"block align {block_align} does not match the format")
    return _Format(tag, channels, rate, block_align, bits)


def _samples(fmt: _Format, body: bytes) -> np.ndarray:
    width = fmt.block_align // fmt.channels
    if fmt.tag == _FORMAT_PCM and width == 1:
        return (np.frombuffer(body, np.uint8).astype(np.float32) - 128.0) / 128.0
    if fmt.tag == _FORMAT_PCM and width == 2:
        return np.frombuffer(body, "<i2").astype(np.float32) / np.float32(32768.0)
    if fmt.tag == _FORMAT_PCM and width == 3:
        raw = np.frombuffer(body, np.uint8).reshape(-1, 3).astype(np.int32)
        value = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        value = np.where(value >= 1 << 23, value - (1 << 24), value)
        return value.astype(np.float32) / np.float32(1 << 23)
    if fmt.tag == _FORMAT_PCM and width == 4:
        return (np.frombuffer(body, "<i4").astype(np.float64) / float(1 << 31)).astype(np.float32)
    if fmt.tag == _FORMAT_FLOAT and width in (4, 8):
        return np.frombuffer(body, "<f4" if width == 4 else "<f8").astype(np.float32)
    raise BadReference(
        "unsupported-encoding", f"format tag {fmt.tag:#06x} with {fmt.bits}-bit samples"
    )


def decode_wav(data: bytes) -> DecodedAudio:
    """Decode a mono WAV file held in memory, refusing anything unusable for a voice prompt."""
    if not data:
        raise BadReference("empty", "no bytes")
    if len(data) > MAX_BYTES:
        raise BadReference("too-large", f"{len(data)} bytes; at most {MAX_BYTES} accepted")
    chunks = _chunks(data)
    if b"fmt " not in chunks:
        raise BadReference("corrupt", "no fmt chunk")
    if b"data" not in chunks:
        raise BadReference("truncated", "no data chunk")
    fmt = _parse_format(chunks[b"fmt "])
    if fmt.channels != 1:
        raise BadReference("multi-channel", f"{fmt.channels} channels; send a mono reference")
    check_sample_rate(fmt.sample_rate)
    body = chunks[b"data"]
    if len(body) % fmt.block_align:
        raise BadReference("truncated", "data chunk ends inside a sample frame")
    samples = _samples(fmt, body)
    return validate(DecodedAudio(samples, fmt.sample_rate))


def check_sample_rate(rate: int) -> None:
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise BadReference(
            "sample-rate",
            f"{rate} Hz is outside the accepted {MIN_SAMPLE_RATE}-{MAX_SAMPLE_RATE} Hz",
        )


def validate_samples(samples: np.ndarray, sample_rate: int) -> DecodedAudio:
    """The rules of :func:`decode_wav` for audio another decoder produced: mono float samples
    at ``sample_rate``, of any container."""
    check_sample_rate(sample_rate)
    wave = np.asarray(samples)
    if wave.ndim > 1 and sum(int(n) > 1 for n in wave.shape) > 1:
        raise BadReference("multi-channel", f"samples of shape {wave.shape}; send a mono reference")
    if not np.issubdtype(wave.dtype, np.floating):
        raise BadReference("unsupported-encoding", f"samples of type {wave.dtype}")
    return validate(DecodedAudio(wave.reshape(-1).astype(np.float32), int(sample_rate)))


def validate(audio: DecodedAudio) -> DecodedAudio:
    """Refuse empty, non-finite, silent, too short or too long audio."""
    n = audio.samples.shape[0]
    if n == 0:
        raise BadReference("empty", "no samples")
    if not np.isfinite(audio.samples).all():
        raise BadReference("non-finite", "NaN or infinite samples")
    if audio.seconds < MIN_SECONDS:
        raise BadReference("too-short", f"{audio.seconds:.3f} s; at least {MIN_SECONDS} s needed")
    if audio.seconds > MAX_SECONDS:
        raise BadReference("too-long", f"{audio.seconds:.1f} s; at most {MAX_SECONDS} s accepted")
    if float(np.abs(audio.samples).max()) < SILENCE_PEAK:
        raise BadReference("silent", "peak level below -80 dBFS")
    return audio


def encode_wav_pcm16(samples: np.ndarray, sample_rate: int) -> bytes:
    """Write mono 16-bit PCM WAV bytes; used by tests, benchmarks and spooling."""
    pcm = np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", _FORMAT_PCM, 1, sample_rate, sample_rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
    body += b"data" + struct.pack("<I", len(pcm)) + pcm
    return b"RIFF" + struct.pack("<I", len(body)) + body
