"""Bad reference audio is refused with a clear reason; good audio decodes like libsndfile."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import soundfile as sf
from minicpm_speech_runtime.fixtures.synth import voice_like, wav_bytes
from minicpm_speech_runtime.voice.wav import BadReference, decode_wav, encode_wav_pcm16


def _wav(fmt_tag: int, channels: int, rate: int, bits: int, payload: bytes) -> bytes:
    width = (bits + 7) // 8
    fmt = struct.pack(
        "<HHIIHH", fmt_tag, channels, rate, rate * channels * width, channels * width, bits
    )
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _reason(data: bytes) -> str:
    with pytest.raises(BadReference) as err:
        decode_wav(data)
    return err.value.reason


@pytest.mark.parametrize("subtype", ["PCM_16", "PCM_24", "PCM_32", "FLOAT", "PCM_U8"])
def test_decodes_like_soundfile(tmp_path, subtype: str) -> None:  # type: ignore[no-untyped-def]
    x = voice_like(1.0, 22050, 1)
    path = tmp_path / "a.wav"
    sf.write(path, x, 22050, subtype=subtype)
    ref, _ = sf.read(path, dtype="float32")
    got = decode_wav(path.read_bytes())
    assert got.sample_rate == 22050
    np.testing.assert_array_equal(got.samples, ref)


def test_content_hash_ignores_container() -> None:
    x = np.round(voice_like(1.0, 16000, 2) * 32768) / 32768
    pcm = decode_wav(encode_wav_pcm16(x, 16000))
    flt = decode_wav(_wav(3, 1, 16000, 32, x.astype("<f4").tobytes()))
    assert pcm.content_hash() == flt.content_hash()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (b"not a wav file at all", "corrupt"),
        (_wav(1, 1, 16000, 16, b""), "empty"),
        (_wav(1, 1, 16000, 16, np.zeros(16000, "<i2").tobytes()), "silent"),
        (_wav(1, 1, 16000, 16, np.full(4000, 1000, "<i2").tobytes()), "too-short"),
        (_wav(1, 2, 16000, 16, np.ones(32000, "<i2").tobytes()), "multi-channel"),
        (_wav(6, 1, 8000, 8, b"\x01" * 8000), "unsupported-encoding"),
        (_wav(1, 1, 4000, 16, np.ones(4000, "<i2").tobytes()), "sample-rate"),
        (_wav(3, 1, 16000, 32, np.full(16000, np.nan, "<f4").tobytes()), "non-finite"),
        (_wav(3, 1, 16000, 32, np.full(16000, np.inf, "<f4").tobytes()), "non-finite"),
        (_wav(1, 1, 8000, 16, np.full(8000 * 31, 1000, "<i2").tobytes()), "too-long"),
    ],
)
def test_refusals(data: bytes, reason: str) -> None:
    assert _reason(data) == reason


def test_truncated_data_chunk() -> None:
    good = wav_bytes(1.0)
    assert _reason(good[: len(good) // 2]) == "truncated"
    assert _reason(good[:-1]) == "truncated"


def test_missing_fmt_is_corrupt() -> None:
    body = b"WAVE" + b"data" + struct.pack("<I", 4) + b"\x00\x01\x00\x01"
    assert _reason(b"RIFF" + struct.pack("<I", len(body)) + body) == "corrupt"
