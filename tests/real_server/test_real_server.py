"""The pod's own command on a real ``vllm serve --omni`` (vLLM-Omni 0.30.0 on vLLM's CPU build),
as a user reaches it: readiness through the supervisor, the project's engine proven to serve
stage 2, and chat-completions requests for speech.

What this lane proves: the operator's rendered command starts vLLM-Omni's three-stage
MiniCPM-o 4.5 pipeline, the plugin takes stage 2 over inside its worker, the warm-up gates
readiness, and replies carry 24 kHz audio decoded by this project's engine. What it does not:
GPU speed, real weights (the voice is noise-like), or audio quality.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from minicpm_speech_runtime.serving.warmup import synthetic_voice_uri, warmup_request_body

from .conftest import SERVED_MODEL, Pod, http_get, skip_outside_lane, stream_and_kill
from .perf_job import job_config, judge, run_job

skip_outside_lane()

pytestmark = pytest.mark.timeout(1800)
ENDED = "minicpm_speech_code2wav_streams_ended_total"


def post(pod: Pod, body: bytes | dict[str, Any], timeout: float = 600.0) -> tuple[int, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{pod.base}/v1/chat/completions", data=data,
        headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def speech(text: str = "Hello there.", **extra: Any) -> dict[str, Any]:
    return {**warmup_request_body(SERVED_MODEL, text=text, max_tokens=16), **extra}


def audio_of(document: dict[str, Any]) -> np.ndarray:
    """The reply's audio, checked as a user's player would read it: a 24 kHz mono WAV."""
    (choice,) = document["choices"]
    data = choice["message"]["audio"]["data"]
    samples, rate = sf.read(io.BytesIO(base64.b64decode(data)), dtype="float32", always_2d=True)
    assert rate == 24000
    assert samples.shape[1] == 1
    return samples[:, 0]


def text_of(document: dict[str, Any]) -> str:
    (choice,) = document["choices"]
    content = choice["message"].get("content")
    return content if isinstance(content, str) else ""


def ended_done(pod: Pod) -> float:
    match = re.search(rf'^{ENDED}{{reason="done"}} (\S+)$', pod.metrics(), re.MULTILINE)
    assert match, f"{ENDED} is not on the supervisor's /metrics"
    return float(match.group(1))


def check_speech(status: int, raw: bytes) -> np.ndarray:
    assert status == 200, raw[:500]
    document = json.loads(raw)
    audio = audio_of(document)
    assert audio.size > 0 and bool(np.isfinite(audio).all())
    assert text_of(document).strip(), "the reply has no text part"
    return audio


def test_the_pod_is_ready_with_this_projects_engine_in_stage_2(pod: Pod) -> None:
    """``/readyz`` answers 200 only after the warm-up; the plugin wrote its record from the
    stage-2 worker (not the supervisor or the API server), and the warm-up's requests were
    decoded by this project's engine there: vLLM-Omni's own Code2Wav writes neither."""
    status, body = http_get(f"{pod.health}/readyz")
    assert status == 200, body
    plugin = pod.control_file("plugin.json")
    assert plugin["options"]["batched_code2wav"] is True
    assert plugin["pid"] != pod.process.pid
    assert pod.control_file("precapture.json")["state"] == "skipped"
    metrics = pod.metrics()
    assert re.search(r"^minicpm_speech_ready 1\.0$", metrics, re.MULTILINE)
    warm = re.search(r'^minicpm_speech_warmup_requests_total{result="ok"} (\S+)$', metrics,
                     re.MULTILINE)
    assert warm and float(warm.group(1)) >= 1
    assert ended_done(pod) >= float(warm.group(1))


def test_a_speech_request_gets_text_and_24khz_audio_from_the_engine(pod: Pod) -> None:
    before = ended_done(pod)
    begin = time.monotonic()
    audio = check_speech(*post(pod, speech("Please read this sentence aloud.")))
    print(f"\none request: {audio.size / 24000:.2f} s of audio in "
          f"{time.monotonic() - begin:.1f} s")
    assert ended_done(pod) == before + 1


def test_four_concurrent_requests_each_with_its_own_reference_voice(pod: Pod) -> None:
    """The reference voice travels in the body's ``ref_audio`` (a data URI), the field
    vLLM-Omni's chat endpoint reads for MiniCPM-o 4.5."""
    before = ended_done(pod)
    bodies = [speech(f"Voice number {i}.", ref_audio=synthetic_voice_uri(seed=i))
              for i in range(4)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda b: post(pod, b), bodies))
    for status, raw in results:
        check_speech(status, raw)
    assert ended_done(pod) == before + 4


def stream_events(pod: Pod, body: dict[str, Any], timeout: float = 600.0) -> list[dict[str, Any]]:
    """The server-sent events of a streamed reply, in arrival order, up to ``[DONE]``."""
    request = urllib.request.Request(
        f"{pod.base}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as r:
        assert r.status == 200
        return events_of(r)


def events_of(response: Iterable[bytes]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for line in response:
        text = line.decode().strip()
        if not text.startswith("data:"):
            continue
        payload = text[len("data:"):].strip()
        if payload == "[DONE]":
            return events
        events.append(json.loads(payload))
    raise AssertionError(f"the stream ended without [DONE] after {len(events)} events")


def test_a_streamed_reply_joins_into_the_whole_reply(pod: Pod) -> None:
    """Audio arrives in events of modality ``audio`` (a WAV each, base64 in the delta's
    content), in order; joined, it is as long as the reply of the same request unstreamed (the
    Talker's output is capped, so both are that long)."""
    whole = check_speech(*post(pod, speech("Streaming test.")))
    events = stream_events(pod, speech("Streaming test.", stream=True))
    chunks = []
    for event in events:
        if event.get("modality") != "audio":
            continue
        for choice in event.get("choices") or []:
            data = (choice.get("delta") or {}).get("content")
            if data:
                samples, rate = sf.read(io.BytesIO(base64.b64decode(data)), dtype="float32",
                                        always_2d=True)
                assert rate == 24000 and samples.shape[1] == 1
                chunks.append(samples[:, 0])
    kinds = [e.get("modality") for e in events]
    print(f"\nstreamed: {len(chunks)} audio chunk(s) in {len(events)} events {kinds}")
    assert len(chunks) > 1, f"{len(chunks)} audio chunk(s) in {len(events)} events: {kinds}"
    joined = np.concatenate(chunks)
    assert bool(np.isfinite(joined).all())
    assert joined.size == whole.size


def test_the_api_server_counts_a_stream_and_refuses_new_ones_while_draining(pod: Pod) -> None:
    """What a drain relies on, in vLLM-Omni's own API server: the pod command's middleware
    counts a streamed request from its arrival and releases it once the answer is done, and once
    the supervisor's drain file exists a new request is answered 503 with Retry-After (the pod
    itself is left serving)."""
    in_flight = re.compile(r"^minicpm_speech_requests_in_flight (\S+)$", re.MULTILINE)

    def counted() -> float:
        match = in_flight.search(pod.metrics())
        assert match, "minicpm_speech_requests_in_flight is not on the supervisor's /metrics"
        return float(match.group(1))

    def settles_to(value: float, within_s: float = 30.0) -> bool:
        """The middleware counts a request once the server has parsed its headers and releases
        it when the app returns, which may be a moment after the client's last byte: the count
        must reach ``value`` within the wait, not at once (a leak never reaches 0)."""
        deadline = time.monotonic() + within_s
        while counted() != value:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    # The tiny model's whole streamed reply can be over before one /metrics read on a busy
    # 2-core machine; a request whose body is half sent is in flight for as long as the test
    # holds it, however slow the read.
    body = json.dumps(speech("Drain test.", stream=True)).encode()
    held = http.client.HTTPConnection("127.0.0.1", pod.command.port, timeout=600)
    try:
        held.putrequest("POST", "/v1/chat/completions")
        held.putheader("Content-Type", "application/json")
        held.putheader("Content-Length", str(len(body)))
        held.endheaders()
        held.send(body[: len(body) // 2])
        assert settles_to(1.0), "a request waiting for its body is not counted"
        held.send(body[len(body) // 2:])
        reply = held.getresponse()
        assert reply.status == 200, reply.read()[:500]
        assert events_of(reply)
    finally:
        held.close()
    assert settles_to(0.0), "a finished stream is still counted: a drain would wait for it"
    drain_file = pod.control / "draining.json"
    drain_file.write_text("{}")
    try:
        request = urllib.request.Request(
            f"{pod.base}/v1/chat/completions", data=json.dumps(speech()).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
        assert "shutting down" in json.loads(refused.value.read())["error"]["message"]
        assert http_get(f"{pod.base}/health")[0] == 200
    finally:
        drain_file.unlink()
    check_speech(*post(pod, speech()))
    assert settles_to(0.0), "a finished request is still counted: a drain would wait for it"


@pytest.mark.parametrize(
    "body, why",
    [
        (b'{"model": "x", "messages": [', "malformed JSON"),
        ({"modalities": ["text", "smell"]}, "an unknown modality"),
        ({"ref_audio": "data:audio/wav;base64," + base64.b64encode(b"not audio").decode()},
         "a reference voice that is not audio"),
        ({"max_tokens": 10**9}, "max_tokens far over the model's context"),
    ],
)
def test_a_bad_request_gets_a_4xx_and_the_next_one_is_served(
    pod: Pod, body: bytes | dict[str, Any], why: str
) -> None:
    request = body if isinstance(body, bytes) else {**speech("Bad request."), **body}
    status, raw = post(pod, request, timeout=120.0)
    assert 400 <= status < 500, f"{why}: {status} {raw[:300]!r}"
    assert raw.strip(), f"{why}: the error has no body"
    check_speech(*post(pod, speech("Still serving.")))


def test_the_wer_run_scores_this_pods_speech_with_the_official_evaluator(
    pod: Pod, model_dir: Path, seed_tts: Path, tmp_path: Path
) -> None:
    """``perf-jobs wer run`` as a live WER Job runs it, against this pod: the official client
    with its Seed-TTS WER evaluator on (a tiny random Whisper in Whisper's own layout), four
    sentences at C8 then C1. Random weights make the WER itself meaningless; what is checked
    is that every request was served and judged and every number parsed."""
    from .whisper_folder import write_tiny_whisper

    whisper = write_tiny_whisper(tmp_path / "whisper")
    counts = {"measured": 4, "warmup": 2, "repeats": 1}
    (tmp_path / "job").mkdir()
    config = job_config("wer", model_dir, seed_tts, tmp_path / "job", counts,
                        base_url=pod.base, whisper_model=str(whisper))
    run = run_job(["wer", "run"], config, tmp_path / "job")
    print(f"\nwer run: {run.seconds:.0f} s, exit {run.returncode}\n{run.message}")
    assert run.returncode == 0, f"{run.output[-3000:]}\n{run.logs()}"
    result = judge(run, "wer")
    assert result.reason == "", result.message
    entries = result.doc["wer"]
    assert [e["c"] for e in entries] == [8, 1]
    for entry in entries:
        assert entry["done"] == entry["n"] == counts["measured"]
        assert entry["judged"] == entry["done"]
        assert entry["wer"] is not None and math.isfinite(entry["wer"]) and entry["wer"] >= 0
    wavs = sorted((run.artifacts / "wavs").rglob("*.wav"))
    assert len(wavs) == 2 * counts["measured"]
    for wav in wavs:
        samples, rate = sf.read(wav, dtype="float32")
        assert rate == 24000 and samples.size > 0


def test_a_killed_stage_2_worker_mid_stream_fails_the_pod(pod: Pod) -> None:
    """Stage 2's worker killed during a streamed reply (last: the pod does not survive it).
    The client gets an error event and the end of the stream, not a hang. vLLM-Omni keeps its
    API server up with the stage gone and answers 503 on /health: the supervisor turns
    unready, stops the server and exits non-zero, so that Kubernetes restarts the pod, and the
    records of the dead stage 2 are withdrawn."""
    worker = int(pod.control_file("plugin.json")["pid"])
    lines, error, after = stream_and_kill(pod.base, worker)
    events = [json.loads(line[len(b"data:"):]) for line in lines
              if line.startswith(b"data:") and b"[DONE]" not in line]
    assert error is None and after < 60, (error, after)
    assert any("error" in e for e in events), events[-2:]
    began = time.monotonic()
    while http_get(f"{pod.health}/readyz")[0] == 200:
        assert time.monotonic() - began < 15, "still ready with stage 2 gone"
        time.sleep(0.5)
    rc = pod.process.wait(timeout=180)
    assert rc == 1, pod.log_tail()
    assert "server unhealthy: /health answered 503" in pod.log_tail()
    assert sorted(p.name for p in pod.control.glob("*.json")) == []
