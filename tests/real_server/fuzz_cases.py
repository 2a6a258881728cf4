"""Hostile chat-completions requests for the request fuzzer: seeded, bounded in size, each the
way a careless or malicious client would send it.

Two families: the request body (JSON shapes, types, sizes, nesting, the three sampling blocks)
and the reference voice in ``ref_audio`` (WAV headers, encodings, rates, channels, lengths,
NaN/inf/denormal/clipped samples, truncation, non-audio bytes, data URIs and other schemes).
:data:`REGRESSIONS` are cases that once took the pod down or answered 5xx; they run every time,
before the drawn ones.

Nothing here talks to a server: a :class:`Case` is a body and what the server must answer.
"""

from __future__ import annotations

import base64
import json
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

SERVED_MODEL = "minicpmo45-tiny"
MAX_BODY_BYTES = 4 * 1024 * 1024  # what one case may send: the fuzzer's own bound


@dataclass(frozen=True)
class Case:
    """One request. ``must_refuse``: the server must answer 4xx (content it cannot serve);
    otherwise 2xx or 4xx both pass. Never 5xx."""

    name: str  # "family:detail"
    body: bytes
    must_refuse: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    says: str = ""  # what a refusal's message must contain

    @property
    def family(self) -> str:
        return self.name.split(":", 1)[0]


# The protocol's three sampling blocks with the Talker held to 40 codes (1.6 s of audio), so a
# served case costs about a second on the lane's CPU rather than two and a half.
CAPPED_SAMPLING = [
    {"temperature": 0.0, "max_tokens": 8, "seed": 42},
    {"temperature": 0.0, "max_tokens": 40, "seed": 42},
    {"temperature": 0.0, "max_tokens": 65536},
]


def speech_body(text: str = "Fuzz.", *, capped: bool = True, **extra: Any) -> dict[str, Any]:
    """A good speech request, kept short so a served case costs little; ``capped=False``
    leaves the sampling to the body's top-level fields (the sampling blocks replace them)."""
    body: dict[str, Any] = {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": [{"type": "text", "text": f"Say: {text}"}]}],
        "modalities": ["text", "audio"],
        "max_tokens": 8,
        "temperature": 0.0,
    }
    if capped:
        body["sampling_params_list"] = [dict(block) for block in CAPPED_SAMPLING]
    return {**body, **extra}


def encode(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


# ---------------------------------------------------------------- WAV building


def wav_bytes(samples: np.ndarray, rate: int = 24000, *, tag: int = 3, bits: int = 32,
              channels: int = 1, fmt_size: int = 16, data_size: int | None = None,
              block_align: int | None = None, extra_chunks: bytes = b"") -> bytes:
    """A RIFF/WAVE file whose every header field can be set, true or not."""
    width = max(1, (bits + 7) // 8)
    payload = pcm_payload(samples, tag, bits)
    align = channels * width if block_align is None else block_align
    fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * align & 0xFFFFFFFF, align, bits)
    fmt = (fmt + b"\0" * 64)[:fmt_size]
    size = len(payload) if data_size is None else data_size
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + extra_chunks
    body += b"data" + struct.pack("<I", size & 0xFFFFFFFF) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def pcm_payload(samples: np.ndarray, tag: int, bits: int) -> bytes:
    x = np.asarray(samples, np.float64).reshape(-1)
    if tag == 3:
        with np.errstate(over="ignore"):  # a value past float32 is meant to become inf
            return x.astype("<f8" if bits == 64 else "<f4").tobytes()
    if bits == 8:
        return np.clip(np.nan_to_num(x) * 128 + 128, 0, 255).astype(np.uint8).tobytes()
    if bits == 24:
        v = np.clip(np.nan_to_num(x) * 2**23, -(2**23), 2**23 - 1).astype("<i4")
        return b"".join(int(s).to_bytes(3, "little", signed=True) for s in v)
    kind = {16: "<i2", 32: "<i4"}.get(bits, "<i2")
    scale = 2 ** ({16: 15, 32: 31}.get(bits, 15))
    return np.clip(np.nan_to_num(x) * scale, -scale, scale - 1).astype(kind).tobytes()


def noise(rng: np.random.Generator, seconds: float, rate: int = 24000,
          level: float = 0.1) -> np.ndarray:
    return level * rng.standard_normal(max(0, int(seconds * rate)))


def data_uri(data: bytes, media: str = "audio/wav") -> str:
    return f"data:{media};base64," + base64.b64encode(data).decode()


def with_voice(name: str, ref_audio: Any, must_refuse: bool = False, says: str = "") -> Case:
    return Case(name, encode(speech_body(ref_audio=ref_audio)), must_refuse, says=says)


# ---------------------------------------------------------------- the voice family


def voice_case(rng: np.random.Generator, r: random.Random) -> Case:
    kind = r.choice(VOICE_KINDS)
    return kind(rng, r)


def voice_values(rng: np.random.Generator, r: random.Random) -> Case:
    x = noise(rng, r.uniform(1.0, 4.0))
    what = r.choice(["nan", "inf", "-inf", "denormal", "clipped", "huge", "dc", "silent",
                     "whisper"])
    refuse = what in ("nan", "inf", "-inf", "huge", "silent")
    if what in ("nan", "inf", "-inf"):
        x[rng.integers(0, x.size, r.randint(1, 50))] = float(what)
    elif what == "denormal":
        x = np.full_like(x, 1e-42) * np.sign(rng.standard_normal(x.size))
        refuse = True  # silent
    elif what == "clipped":
        x = np.clip(x * 50, -1.0, 1.0)
    elif what == "huge":
        x = x * 1e39  # float32 overflows to inf
    elif what == "dc":
        x = np.full_like(x, 0.5)
    elif what == "silent":
        x = np.zeros_like(x)
    elif what == "whisper":
        x = x * 1e-3
    return with_voice(f"voice-values:{what}", data_uri(wav_bytes(x)), refuse)


def voice_encoding(rng: np.random.Generator, r: random.Random) -> Case:
    tag, bits = r.choice([(1, 8), (1, 16), (1, 24), (1, 32), (3, 32), (3, 64), (2, 4),
                          (6, 8), (7, 8), (0x55, 16), (1, 12), (3, 16)])
    # 12-bit samples travel in 16-bit containers, as the format allows
    good = (tag, bits) in ((1, 8), (1, 12), (1, 16), (1, 24), (1, 32), (3, 32), (3, 64))
    data = wav_bytes(noise(rng, 2.0, 16000), 16000, tag=tag, bits=bits)
    return with_voice(f"voice-encoding:{tag}-{bits}", data_uri(data), not good)


def voice_rate(rng: np.random.Generator, r: random.Random) -> Case:
    rate = r.choice([8000, 11025, 16000, 22050, 44100, 48000, 96000, 7999, 200000, 1, 0,
                     2**31])
    seconds = 1.0 if rate <= 192000 else 0.0
    data = wav_bytes(noise(rng, seconds, min(rate, 192000)), rate)
    return with_voice(f"voice-rate:{rate}", data_uri(data), not 8000 <= rate <= 192000)


def voice_channels(rng: np.random.Generator, r: random.Random) -> Case:
    channels = r.choice([2, 3, 6, 0])
    x = noise(rng, 1.5 * max(1, channels), 16000)
    data = wav_bytes(x, 16000, channels=channels, tag=1, bits=16)
    return with_voice(f"voice-channels:{channels}", data_uri(data), True)


def voice_length(rng: np.random.Generator, r: random.Random) -> Case:
    seconds = r.choice([0.0, 1 / 24000, 0.1, 0.45, 0.6, 6.5, 12.0, 29.0, 31.0])
    rate = 8000 if seconds > 10 else 24000
    data = wav_bytes(noise(rng, seconds, rate), rate, tag=1, bits=16)
    return with_voice(f"voice-length:{seconds:g}s", data_uri(data),
                      not 0.5 <= seconds <= 30.0)


def voice_header(rng: np.random.Generator, r: random.Random) -> Case:
    x = noise(rng, 1.5)
    what = r.choice(["magic", "fmt-short", "align", "zero-bits", "data-longer", "data-shorter",
                     "no-data", "no-fmt", "odd-chunk", "list-chunk", "riff-size"])
    if what == "magic":
        data = b"RIFX" + wav_bytes(x)[4:]
    elif what == "fmt-short":
        data = wav_bytes(x, fmt_size=12)
    elif what == "align":
        data = wav_bytes(x, block_align=3)
    elif what == "zero-bits":
        data = wav_bytes(x, bits=0)
    elif what == "data-longer":
        data = wav_bytes(x, data_size=x.size * 4 + 4000)
    elif what == "data-shorter":
        data = wav_bytes(x, data_size=x.size * 2 + 2)
    elif what == "no-data":
        data = wav_bytes(x)[: 12 + 8 + 16]
    elif what == "no-fmt":
        full = wav_bytes(x)
        data = full[:12] + full[12 + 8 + 16:]
    elif what == "odd-chunk":
        data = wav_bytes(x, extra_chunks=b"junk" + struct.pack("<I", 3) + b"abc\0")
    elif what == "list-chunk":
        data = wav_bytes(x, extra_chunks=b"LIST" + struct.pack("<I", 4) + b"INFO")
    else:
        full = wav_bytes(x)
        data = full[:4] + struct.pack("<I", 0xFFFFFFFF) + full[8:]
    good = what in ("odd-chunk", "list-chunk", "riff-size", "data-shorter")
    return with_voice(f"voice-header:{what}", data_uri(data), not good)


def voice_truncated(rng: np.random.Generator, r: random.Random) -> Case:
    full = wav_bytes(noise(rng, 1.0))
    cut = r.randint(1, len(full) - 1)
    return with_voice(f"voice-truncated:at-{cut}", data_uri(full[:cut]), True)


def voice_not_audio(rng: np.random.Generator, r: random.Random) -> Case:
    what = r.choice(["random", "text", "png", "zip", "empty", "riff-only", "huge-random"])
    data = {
        "random": rng.integers(0, 256, r.randint(1, 4096), dtype=np.uint8).tobytes(),
        "text": b"Hello, I am not a sound at all." * 10,
        "png": b"\x89PNG\r\n\x1a\n" + bytes(64),
        "zip": b"PK\x03\x04" + bytes(64),
        "empty": b"",
        "riff-only": b"RIFF\0\0\0\0WAVE",
        "huge-random": rng.integers(0, 256, 2 * 1024 * 1024, dtype=np.uint8).tobytes(),
    }[what]
    return with_voice(f"voice-not-audio:{what}", data_uri(data), True)


def voice_uri(rng: np.random.Generator, r: random.Random) -> Case:
    good = base64.b64encode(wav_bytes(noise(rng, 1.0))).decode()
    what = r.choice(["no-base64", "bad-base64", "image-mime", "no-mime", "file", "http-closed",
                     "ftp", "javascript", "relative", "long", "number", "list", "object",
                     "null", "empty-string", "whitespace"])
    value: Any = {
        "no-base64": "data:audio/wav," + good[:200],
        "bad-base64": "data:audio/wav;base64," + "!!!!" + good[4:400],
        "image-mime": "data:image/png;base64," + good,
        "no-mime": "data:;base64," + good,
        "file": "file:///etc/passwd",
        "http-closed": "http://127.0.0.1:9/voice.wav",
        "ftp": "ftp://127.0.0.1/voice.wav",
        "javascript": "javascript:alert(1)",
        "relative": "../../voice.wav",
        "long": "data:audio/wav;base64," + "QUFB" * 600_000,
        "number": 42,
        "list": [data_uri(b"RIFF")],
        "object": {"url": "x"},
        "null": None,
        "empty-string": "",
        "whitespace": "   ",
    }[what]
    acceptable = what in ("null", "image-mime", "no-mime")  # null: no voice; mime is advisory
    return with_voice(f"voice-uri:{what}", value, not acceptable)


VOICE_KINDS: list[Callable[[np.random.Generator, random.Random], Case]] = [
    voice_values, voice_encoding, voice_rate, voice_channels, voice_length, voice_header,
    voice_truncated, voice_not_audio, voice_uri,
]


# ---------------------------------------------------------------- the body family


def body_case(rng: np.random.Generator, r: random.Random) -> Case:
    kind = r.choice(BODY_KINDS)
    return kind(rng, r)


def body_shape(rng: np.random.Generator, r: random.Random) -> Case:
    what = r.choice(["list", "string", "number", "null", "truncated", "not-json", "nested",
                     "utf8-garbage", "duplicate-keys", "empty"])
    raw = encode(speech_body(capped=False))
    data = {
        "list": b"[1, 2, 3]",
        "string": b'"speak"',
        "number": b"12",
        "null": b"null",
        "truncated": raw[: r.randint(1, len(raw) - 1)],
        "not-json": b"model=x&messages=y",
        "nested": b'{"model": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        "utf8-garbage": raw[:20] + b"\xff\xfe\xfd" + raw[20:],
        "duplicate-keys": raw[:-1] + b', "model": "other"}',
        "empty": b"",
    }[what]
    return Case(f"body-shape:{what}", data, True)


def body_types(rng: np.random.Generator, r: random.Random) -> Case:
    """A top-level field of the wrong type or range; the bool says it must be refused (pydantic
    coerces some, "8" to 8 say, and vLLM-Omni serves some it ignores, ``n`` say)."""
    field, value, refuse = r.choice([
        ("messages", "hello", True), ("messages", [], True), ("messages", [1, 2], True),
        ("messages", [{"role": "user"}], False), ("messages", [{"role": "wizard"}], False),
        ("model", 7, True), ("model", "no-such-model", True), ("modalities", "audio", True),
        ("modalities", ["text", "smell"], True), ("modalities", [None], True),
        ("max_tokens", -1, True), ("max_tokens", 0, True), ("max_tokens", 10**9, True),
        ("max_tokens", 2.5, True), ("max_tokens", "8", False), ("max_tokens", 1, False),
        ("max_completion_tokens", 1, False), ("stop", ["!"], False), ("temperature", -1, True),
        ("temperature", "hot", True), ("top_p", 7, True), ("n", 3, False),
        ("stream", "yes", False), ("seed", 2**80, True), ("seed", -(2**70), True),
        ("chat_template_kwargs", "x", True), ("chat_template_kwargs", {"x": [1]}, False),
        ("stop", 5, True), ("logprobs", 3, True), ("response_format", {"type": "no"}, True),
    ])
    return Case(f"body-type:{field}={str(value)[:20]}",
                encode(speech_body(capped=False, **{field: value})), refuse)


def body_size(rng: np.random.Generator, r: random.Random) -> Case:
    what = r.choice(["long-text", "many-messages", "long-key", "many-keys"])
    if what == "long-text":
        body = speech_body(text="word " * r.randint(5_000, 50_000))
    elif what == "many-messages":
        body = speech_body(capped=False)
        body["messages"] = [{"role": "user", "content": "hi"}] * r.randint(500, 2000)
    elif what == "long-key":
        body = speech_body(**{"k" * 100_000: 1})
    else:
        body = speech_body(**{f"extra_{i}": i for i in range(5000)})
    data = encode(body)[:MAX_BODY_BYTES]
    return Case(f"body-size:{what}", data, what in ("long-text", "many-messages"))


def sampling_case(rng: np.random.Generator, r: random.Random) -> Case:
    base = CAPPED_SAMPLING
    stage = r.randrange(3)
    key, value = r.choice([
        ("no_such_param", 1), ("max_tokens", "8"), ("max_tokens", 2.5), ("max_tokens", -3),
        ("max_tokens", 2**70), ("temperature", "hot"), ("temperature", -2.0), ("top_p", 1.5),
        ("top_k", -7), ("top_k", 1e9), ("seed", 2**70), ("seed", -1), ("stop", 5),
        ("stop", [1, 2]), ("min_tokens", 10_000), ("repetition_penalty", 0.0),
        ("detokenize", "no"), ("logprobs", -5), ("extra_args", [1]), ("n", 0),
        ("output_kind", 99), ("max_tokens", 4),
    ])
    blocks = [dict(b) for b in base]
    blocks[stage][key] = value
    shape = r.choice(["list", "list", "short", "long", "not-dicts", "string", "null"])
    value_of: Any = {
        "list": blocks, "short": blocks[:1], "long": [*blocks, *blocks],
        "not-dicts": [1, "x", None], "string": "temperature=0", "null": None,
    }[shape]
    carried = shape in ("one", "list", "long") or (shape == "short" and stage == 0)
    harmless = (key, value) in (("seed", -1), ("max_tokens", 4))
    return Case(f"sampling-{shape}:{stage}.{key}={str(value)[:12]}",
                encode(speech_body(sampling_params_list=value_of)),
                shape in ("long", "not-dicts", "string", "null") or (carried and not harmless))


def request_id_case(rng: np.random.Generator, r: random.Random) -> Case:
    """A request id of the client's choosing, in the body or the ``X-Request-Id`` header."""
    value, good = r.choice([
        ("x/y", False), ("../../etc/passwd", False), ("a" * 300, False), ("sp ace", False),
        ("", False), ("ünï", False), ("id\u0000nul", False), ("ok.id:1-2_3", True),
        (f"client-{r.randrange(10**9)}", True),
    ])
    where = r.choice(["body", "header"])
    if where == "body" or not (value.isascii() and value.isprintable()):  # HTTP's own rules
        return Case(f"request-id:body={value[:20]!r}", encode(speech_body(request_id=value)),
                    not good)
    return Case(f"request-id:header={value[:20]!r}", encode(speech_body()), not good,
                headers=(("X-Request-Id", value),))


BODY_KINDS: list[Callable[[np.random.Generator, random.Random], Case]] = [
    body_shape, body_types, body_size, sampling_case, sampling_case, request_id_case,
]


def draw(seed: int, count: int) -> list[Case]:
    """``count`` cases, half of each family, the same for the same seed."""
    r = random.Random(seed)
    rng = np.random.default_rng(seed)
    return [(voice_case if i % 2 else body_case)(rng, r) for i in range(count)]


# ---------------------------------------------------------------- regressions


def _nan_inf_voice() -> Case:
    x = noise(np.random.default_rng(1), 3.0)
    x[[10, 20, 30, 40]] = [np.nan, np.inf, -np.inf, np.nan]
    return with_voice("regression:nan-inf-voice", data_uri(wav_bytes(x)), True,
                      "bad reference audio (non-finite)")


REGRESSIONS: list[Case] = [
    # stage 2's engine died on vLLM-Omni's non_finite_ref_audio; every later request got 500
    _nan_inf_voice(),
    # a valid header over an empty data chunk: empty_ref_audio, the same death
    with_voice("regression:empty-data-chunk", data_uri(wav_bytes(np.zeros(0))), True,
               "bad reference audio (empty)"),
    # an unknown sampling key answered 500 "Unexpected keyword argument"
    Case("regression:unknown-sampling-key",
         encode(speech_body(sampling_params_list=[{"max_tokens": 8, "no_such_param": 1}])),
         True, says="unknown sampling parameter 'no_such_param'"),
    # an ill-typed sampling value answered 500 ("'<' not supported")
    Case("regression:string-max-tokens",
         encode(speech_body(sampling_params_list=[{"max_tokens": "8"}])), True,
         says="a value of the wrong type"),
    # a one-token Thinker reply left the Talker no condition; its stage died ("requires tensor
    # tts_token_ids"), and every later request got 500. Now: text, no audio.
    Case("regression:one-token-reply", encode(speech_body(capped=False, max_tokens=1))),
    # a stop string met at the first token: the same one-token reply
    Case("regression:stop-at-first-token", encode(speech_body(capped=False, stop=["!"]))),
    # a request id with a "/" (or past about 250 characters) never reached stage 2: its client
    # waited forever
    Case("regression:slash-in-request-id", encode(speech_body(request_id="x/y")), True,
         says="not a request id this server can carry"),
]
