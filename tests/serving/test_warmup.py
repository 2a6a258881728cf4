"""The warm-up request body is a pure function; waiting for the plugin's files."""

from __future__ import annotations

import base64
import io
import threading
import time
import wave
from pathlib import Path

import pytest
from minicpm_speech_runtime.serving.control import PLUGIN_FILE, PRECAPTURE_FILE, write_json
from minicpm_speech_runtime.serving.warmup import (
    WarmupError,
    has_audio,
    synthetic_voice_uri,
    wait_for_plugin,
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


def test_a_server_without_the_plugin_fails_the_warm_up_soon_after_health(tmp_path: Path) -> None:
    """Stage 2 writes plugin.json while it builds, before the server answers /health: waiting
    out the whole warm-up timeout for it would only hide a plugin that never loaded."""
    begin = time.monotonic()
    with pytest.raises(WarmupError, match=r"wrote no plugin\.json .* entry point installed"):
        wait_for_plugin(tmp_path, precapture=True, deadline=begin + 600,
                        keep_going=lambda: True, after_health_s=0.3)
    assert time.monotonic() - begin < 5


def test_precapture_may_finish_after_health(tmp_path: Path) -> None:
    write_json(tmp_path, PLUGIN_FILE, {"pid": 1})
    threading.Timer(0.6, write_json, (tmp_path, PRECAPTURE_FILE, {"state": "done"})).start()
    document = wait_for_plugin(tmp_path, precapture=True, deadline=time.monotonic() + 30,
                               keep_going=lambda: True, after_health_s=0.1)
    assert document["state"] == "done"
