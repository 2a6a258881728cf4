"""The warm-up request body is a pure function."""

from __future__ import annotations

import base64
import io
import wave

import pytest
from minicpm_speech_runtime.serving.warmup import (
    has_audio,
    synthetic_voice_uri,
    warmup_request_body,
)


def test_body_asks_for_text_and_audio() -> None:
    body = warmup_request_body("minicpm-o", "Hello there.")
    assert body["model"] == "minicpm-o"
    assert body["modalities"] == ["text", "audio"]
    assert body["stream"] is False
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Say exactly: Hello there."}]}
    ]
    assert "ref_audio" not in body
    assert warmup_request_body("minicpm-o", "Hello there.") == body  # deterministic


def test_body_with_reference_voice() -> None:
    uri = synthetic_voice_uri(1)
    body = warmup_request_body("m", ref_audio=uri)
    assert body["ref_audio"] == uri
    data = base64.b64decode(uri.split(",", 1)[1])
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
        assert w.getnframes() == 48000
    assert synthetic_voice_uri(1) == uri and synthetic_voice_uri(2) != uri


@pytest.mark.parametrize(("model", "text", "ref"), [("", "x", None), ("m", "  ", None),
                                                    ("m", "x", "not-a-uri")])
def test_body_refuses_nonsense(model: str, text: str, ref: str | None) -> None:
    with pytest.raises(ValueError):
        warmup_request_body(model, text, ref_audio=ref)


def test_has_audio() -> None:
    assert has_audio({"choices": [{"message": {"audio": {"data": "AAAA"}}}]})
    assert not has_audio({"choices": [{"message": {"audio": None}}]})
    assert not has_audio({})
