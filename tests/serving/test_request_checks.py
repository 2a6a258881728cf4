"""What the API server refuses before a request enters the pipeline: reference voices by the
rules stage 2's preparation uses, and sampling blocks by their stage's parameters class."""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import numpy as np
import pytest
from minicpm_speech_runtime.serving.request_checks import (
    MAX_REFERENCE_URI_CHARS,
    RequestRefused,
    check_decoded_reference,
    check_reference_source,
    check_request_id,
    check_sampling_blocks,
)
from minicpm_speech_runtime.voice.wav import MAX_BYTES, encode_wav_pcm16


def wav_f32(samples: np.ndarray, rate: int = 24000, channels: int = 1) -> bytes:
    data = np.asarray(samples, "<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, channels, rate, rate * 4 * channels, 4 * channels, 32)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
    body += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def uri(data: bytes, media: str = "audio/wav") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def voice(seconds: float = 3.0, rate: int = 24000) -> np.ndarray:
    rng = np.random.default_rng(0)
    return (0.1 * rng.standard_normal(int(seconds * rate))).astype(np.float32)


def refusal(source: object) -> RequestRefused:
    with pytest.raises(RequestRefused) as caught:
        check_reference_source(source)
    return caught.value


def test_a_good_voice_passes_the_door() -> None:
    check_reference_source(uri(wav_f32(voice())))
    check_reference_source(uri(encode_wav_pcm16(voice(rate=16000), 16000)))
    check_decoded_reference((voice(), 24000))


def test_nan_and_inf_samples_are_refused_naming_the_field_and_the_reason() -> None:
    bad = voice()
    bad[[100, 200, 300]] = [np.nan, np.inf, -np.inf]
    refused = refusal(uri(wav_f32(bad)))
    assert refused.parameter == "ref_audio"
    assert "non-finite" in str(refused) and str(refused).startswith("ref_audio: ")
    assert "mono WAV" in str(refused), "the message says what to send instead"


@pytest.mark.parametrize(("data", "reason"), [
    (wav_f32(np.zeros(0, np.float32)), "empty"),
    (wav_f32(np.zeros(72000, np.float32)), "silent"),
    (wav_f32(voice(0.2)), "too-short"),
    (wav_f32(voice(31.0, 8000), rate=8000), "too-long"),
    (wav_f32(np.repeat(voice(), 2), channels=2), "multi-channel"),
    (wav_f32(voice(1.0, 4000), rate=4000), "sample-rate"),
    (wav_f32(voice())[:-3], "truncated"),
])
def test_each_voice_rule_refuses_at_the_door(data: bytes, reason: str) -> None:
    assert f"({reason})" in str(refusal(uri(data)))


def test_a_reference_uri_past_the_size_bound_is_refused_before_it_is_decoded() -> None:
    refused = refusal("data:audio/wav;base64," + "A" * MAX_REFERENCE_URI_CHARS)
    assert "at most" in str(refused) and refused.parameter == "ref_audio"
    assert MAX_REFERENCE_URI_CHARS >= 4 * MAX_BYTES // 3


@pytest.mark.parametrize("source", [
    "https://example.com/voice.wav",  # vLLM's media loader fetches and decodes it
    "data:audio/wav;base64,bm90IGF1ZGlv",  # not RIFF: vLLM's decoder answers it
    "data:audio/flac;base64,ZkxhQwAAACIQABAAAAAA",
    "data:audio/wav,RIFF",  # not base64
    12,  # not a string: vLLM-Omni refuses it itself
])
def test_what_is_not_a_base64_wav_is_left_to_vllms_loader(source: object) -> None:
    check_reference_source(source)


@pytest.mark.parametrize(("decoded", "reason"), [
    ((np.full(72000, np.nan, np.float32), 24000), "non-finite"),
    ((np.zeros(0, np.float32), 24000), "empty"),
    ((np.zeros(72000, np.float32), 24000), "silent"),
    ((np.stack([voice(), voice()]), 24000), "multi-channel"),
    ((voice(), 24000.5), "sample-rate"),
    ((voice(), 0), "sample-rate"),
])
def test_decoded_audio_of_any_container_is_held_to_the_same_rules(
        decoded: tuple[np.ndarray, float], reason: str) -> None:
    with pytest.raises(RequestRefused, match=rf"\({reason}\)"):
        check_decoded_reference(decoded)


@dataclass
class Params:
    """Stands for a stage's sampling parameters class (a dataclass, as vLLM-Omni's diffusion
    stages have)."""

    max_tokens: int = 16
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if self.temperature < 0:
            raise ValueError("temperature must be non-negative")


def sampling_refusal(blocks: object) -> RequestRefused:
    with pytest.raises(RequestRefused) as caught:
        check_sampling_blocks(blocks, lambda i: Params if i < 3 else None)
    return caught.value


def test_an_unknown_sampling_key_is_refused_naming_it_and_its_stage() -> None:
    refused = sampling_refusal([{}, {"max_tokens": 8, "no_such_param": 1}])
    assert refused.parameter == "sampling_params_list[1].no_such_param"
    assert "'no_such_param'" in str(refused) and "stage 1" in str(refused)


def test_an_ill_typed_value_is_refused_naming_its_key() -> None:
    refused = sampling_refusal([{"temperature": 0.5, "max_tokens": "8"}])
    assert refused.parameter == "sampling_params_list[0].max_tokens"


def test_an_integer_no_64_bit_field_holds_is_refused() -> None:
    assert sampling_refusal([{"max_tokens": 2**70}]).parameter == (
        "sampling_params_list[0].max_tokens")


def test_blocks_that_are_not_a_list_of_objects_are_refused_saying_what_is_wanted() -> None:
    assert "list of objects" in str(sampling_refusal("temperature=0"))
    assert "list of objects" in str(sampling_refusal(None))
    assert sampling_refusal([{}, 5]).parameter == "sampling_params_list[1]"


def test_good_blocks_and_rules_across_values_are_left_to_the_class() -> None:
    check_sampling_blocks([{"max_tokens": 8}, {"temperature": 0.0}], lambda i: Params)
    check_sampling_blocks([{"max_tokens": 0}], lambda i: Params)  # the class's own 400
    check_sampling_blocks([{"anything": 1}], lambda i: None)  # a stage beyond the pipeline


@pytest.mark.parametrize("value", ["x/y", "a" * 129, "sp ace", "", "ünï", "-lead", 12])
def test_a_request_id_the_stages_cannot_carry_is_refused(value: object) -> None:
    with pytest.raises(RequestRefused) as caught:
        check_request_id(value, "X-Request-Id")
    assert caught.value.parameter == "X-Request-Id" and "letters, digits" in str(caught.value)


@pytest.mark.parametrize("value", [None, "chatcmpl-1", "ok.id:1-2_3", "a" * 128])
def test_a_request_id_the_stages_carry_passes(value: object) -> None:
    check_request_id(value, "request_id")
