"""The warm-up that gates readiness.

Once the server answers ``GET /health``:

1. With ``batched_code2wav`` on, wait for the plugin's ``plugin.json`` in the control
   directory (proof that stage 2 runs this project's runtime); with ``--precapture`` also for
   ``precapture.json`` with state ``done`` (the stage-2 process captured its decode and setup
   graphs from the default reference at load time, see :mod:`.backend`). ``failed`` fails
   the warm-up.
2. Send ``--warmup-requests`` real chat completions (text + audio, a short sentence): the
   first with the model's default voice, the rest at once, each with its own synthetic
   reference voice, so new-reference setup runs batched as in serving. Every response must be
   200 and carry audio.

Only then does ``/readyz`` answer 200.
"""

from __future__ import annotations

import base64
import io
import json
import math
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .control import PLUGIN_FILE, PRECAPTURE_FILE, read_json

WARMUP_SENTENCE = "The quick brown fox jumps over the lazy dog."


class WarmupError(Exception):
    pass


def warmup_request_body(
    model: str,
    text: str = WARMUP_SENTENCE,
    ref_audio: str | None = None,
    max_tokens: int = 128,
) -> dict[str, Any]:
    """One OpenAI chat-completions request that makes the server speak ``text``.

    ``ref_audio`` is a URI (``data:audio/wav;base64,...``) of a reference voice; vLLM-Omni's
    chat endpoint reads it from the body's ``ref_audio`` for MiniCPM-o 4.5.
    """
    if not model:
        raise ValueError("model must be named")
    if not text.strip():
        raise ValueError("text must not be empty")
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"Say exactly: {text}"}]}
        ],
        "modalities": ["text", "audio"],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": False,
    }
    if ref_audio is not None:
        if not ref_audio.startswith(("data:", "http://", "https://", "file:")):
            raise ValueError("ref_audio must be a URI")
        body["ref_audio"] = ref_audio
    return body


def synthetic_voice_uri(seed: int, seconds: float = 3.0, rate: int = 16000) -> str:
    """A voiced-sounding WAV (harmonics with vibrato and syllable envelope) as a data URI."""
    f0 = 110.0 + 23.0 * (seed % 7)
    n = int(seconds * rate)
    frames = bytearray()
    phase = 0.0
    for i in range(n):
        t = i / rate
        f = f0 * (1.0 + 0.03 * math.sin(2 * math.pi * 5.0 * t))
        phase += 2 * math.pi * f / rate
        env = 0.5 * (1 - math.cos(2 * math.pi * 3.0 * t))
        s = sum(math.sin(k * phase) / k for k in range(1, 6)) * env * 0.25
        frames += int(max(-1.0, min(1.0, s)) * 32767).to_bytes(2, "little", signed=True)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(bytes(frames))
    return "data:audio/wav;base64," + base64.b64encode(buf.getvalue()).decode()


def http_status(url: str, timeout: float) -> int:
    """The status a GET of ``url`` answers; 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def wait_for_health(
    base: str, deadline: float, keep_going: Callable[[], bool], interval: float = 1.0
) -> None:
    while http_status(f"{base}/health", timeout=5.0) != 200:
        if not keep_going():
            raise WarmupError("server stopped before it answered /health")
        if time.monotonic() > deadline:
            raise WarmupError("server did not answer /health before the warm-up timeout")
        time.sleep(interval)


# vLLM-Omni answers /health once every stage is built, and the plugin writes plugin.json while
# stage 2 builds: its absence this long after /health means the plugin never took over.
PLUGIN_AFTER_HEALTH_S = 30.0


def wait_for_plugin(
    control: Path, precapture: bool, deadline: float, keep_going: Callable[[], bool],
    after_health_s: float = PLUGIN_AFTER_HEALTH_S,
) -> dict[str, Any]:
    """Wait for the plugin's files (called once the server answers /health); returns the
    precapture document (or the plugin's)."""
    missing_by = time.monotonic() + after_health_s
    while True:
        plugin = read_json(control, PLUGIN_FILE)
        pre = read_json(control, PRECAPTURE_FILE)
        if plugin is not None and not precapture:
            return plugin
        if pre is not None:
            if pre.get("state") == "failed":
                raise WarmupError(f"graph precapture failed: {pre.get('reason', 'no reason')}")
            if pre.get("state") in ("done", "skipped") and plugin is not None:
                return pre
        if not keep_going():
            raise WarmupError("server stopped during the warm-up")
        if plugin is None and time.monotonic() > missing_by:
            raise WarmupError(
                f"the server answers /health but stage 2 wrote no plugin.json after "
                f"{after_health_s:g} s: the plugin did not take stage 2 over (is the "
                "vllm_omni.general_plugins entry point installed?)")
        if time.monotonic() > deadline:
            what = "precapture.json" if plugin is not None else "plugin.json"
            raise WarmupError(
                f"stage 2 wrote no {what} (is the vllm_omni.general_plugins entry point "
                "installed?)"
            )
        time.sleep(0.5)


def post_chat(base: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            document: dict[str, Any] = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode(errors="replace")
        raise WarmupError(f"warm-up request answered {exc.code}: {detail}") from None
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise WarmupError(f"warm-up request failed: {exc}") from None
    if not has_audio(document):
        raise WarmupError("warm-up response carries no audio")
    return document


def has_audio(document: dict[str, Any]) -> bool:
    """Whether a chat-completions response holds non-empty audio in some choice."""
    for choice in document.get("choices") or []:
        message = choice.get("message") or {}
        audio = message.get("audio") or {}
        if isinstance(audio, dict) and audio.get("data"):
            return True
    return False


def run_requests(
    base: str, model: str, count: int, timeout: float, on_result: Callable[[bool], None]
) -> None:
    """The first request alone (default voice), then the rest together (own voices)."""
    if count <= 0:
        return

    def one(body: dict[str, Any]) -> None:
        try:
            post_chat(base, body, timeout)
        except WarmupError:
            on_result(False)
            raise
        on_result(True)

    one(warmup_request_body(model))
    bodies = [
        warmup_request_body(model, ref_audio=synthetic_voice_uri(i)) for i in range(1, count)
    ]
    if bodies:
        with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            for future in [pool.submit(one, b) for b in bodies]:
                future.result()
