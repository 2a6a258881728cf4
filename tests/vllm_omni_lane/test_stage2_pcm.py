"""Stage 2 of vLLM-Omni's MiniCPM-o 4.5 pipeline on a random-weight checkpoint (CPU, fp32).

Five interleaved requests (the model's default voice, two 16 kHz references of one voice, a
24 kHz reference) go through vLLM-Omni's own Code2Wav model, with Stage 1's connector cutting
the Talker's tokens into windows (see ``stage2.py``). The PCM of vLLM-Omni's own path, of this
project's runtime behind the plugin, and of this project's engine driven directly agree within
1e-4 on the same weights, tokens and noise (HiFT's NSF source draws zeros on both sides).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY

pytest.importorskip(
    "vllm_omni", reason="vLLM-Omni is not installed here; `make test-vllm-omni` runs this lane"
)
from minicpm_speech_runtime.bench.parity import TOL, drain, engine, utterance
from minicpm_speech_runtime.bench.stage2 import (
    CONNECTOR,
    SILENCE,
    Request,
    Stage2,
    build_code2wav,
    cfm_noise,
    fixed_vocoder_noise,
)
from minicpm_speech_runtime.fixtures.synth import voice_like
from minicpm_speech_runtime.serving.backend import Code2WavBackend
from minicpm_speech_runtime.serving.batched import voice_from_features
from minicpm_speech_runtime.voice.device import DeviceHalf, PreparedVoice
from minicpm_speech_runtime.voice.host import prepare_host
from minicpm_speech_runtime.voice.speaker import make_speaker
from vllm_omni.model_executor.models.minicpmo_4_5.batched_token2wav import (
    BatchedToken2Wav,
)

# Each test builds vLLM-Omni's model and this project's (two speech tokenizers at released
# size) and decodes on 2 CPU cores; the suite's 300 s is too short on a loaded machine.
pytestmark = pytest.mark.timeout(1200)
CPU = torch.device("cpu")
VOICE_16K = voice_like(2.0, 16000, seed=1)
REQUESTS = [
    Request("default-long", utterance(131, 10)),
    Request("ref16k-a", utterance(77, 11), VOICE_16K, 16000),
    Request("ref24k", utterance(60, 13), voice_like(3.0, 24000, seed=2), 24000, start=3),
    # Same voice as ref16k-a, joining later: its first chunk meets ref16k-a's steady ones.
    Request("ref16k-b", utterance(50, 12), VOICE_16K, 16000, start=9),
    Request("default-short", utterance(20, 14), start=30),
]


class Code2WavPath:
    """One Code2Wav model of the pipeline and what a run of ``REQUESTS`` gave."""

    def __init__(self, model: Any, extras: dict[str, Any], noise: torch.Tensor) -> None:
        self.model, self.extras = model, extras
        cfm_noise(model).copy_(noise)
        self.stage: Stage2 | None = None
        self.pcm: dict[str, np.ndarray] = {}

    def run(
        self,
        requests: Sequence[Request],
        burst: Sequence[int] = (1,),
        finish_with_last: bool = False,
    ) -> tuple[Stage2, dict[str, np.ndarray]]:
        stage = Stage2(self.model, self.extras)
        with fixed_vocoder_noise():
            pcm = stage.run(requests, burst, finish_with_last)
        return stage, pcm

    def reference(self, request: Request) -> tuple[str, str]:
        """(prompt cache id, WAV path) vLLM-Omni gives the request's voice."""
        if request.ref is None:
            wav, cache_id = self.model._normalized_default_prompt()
            return cache_id, wav
        _, entry = self.model._materialize_runtime_prompt(request.ref, request.ref_rate)
        return entry.cache_id, entry.path


def engine_direct(
    models: Any,
    noise: torch.Tensor,
    streams: Sequence[tuple[str, PreparedVoice, list[int]]],
    finish_with_last: bool = False,
) -> dict[str, np.ndarray]:
    """This project's engine on whole utterances: the token stream vLLM-Omni's windows carry
    (three silence codes, then the utterance), cut into its own chunks. The finish comes as it
    does in ``Stage2.run``: after the last token, once the chunks it completed are decoded, or
    with ``finish_with_last`` together with it."""
    models.flow.decoder.rand_noise.copy_(noise)
    eng = engine(models, max_prompt_frames=300)
    for sid, voice, tokens in streams:
        eng.add_stream(sid, voice)
        eng.push_tokens(sid, [SILENCE] * 3 + tokens, last=finish_with_last)
    unfinished = set() if finish_with_last else {sid for sid, *_ in streams}
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    with fixed_vocoder_noise():
        for _ in drain(eng, got, reasons):
            for sid in [s for s in unfinished if not eng.has_output(s)]:
                eng.push_tokens(sid, [], last=True)
                unfinished.discard(sid)
    assert set(reasons.values()) == {"done"}
    return {sid: np.concatenate(got[sid]) for sid, *_ in streams}


def assert_close(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for rid in want:
        assert got[rid].shape == want[rid].shape, rid
        assert float(np.abs(got[rid] - want[rid]).max()) <= TOL, rid
        assert float(np.abs(want[rid]).max()) > 1e-3, rid  # audio, not silence


@pytest.fixture(scope="module")
def own(plugin_on: Path, model_dir: Path, noise: torch.Tensor) -> Code2WavPath:
    """vLLM-Omni's own stage 2: the plugin is registered in this process, this stage's extras
    leave the runtime off."""
    extras = dict(CONNECTOR)
    path = Code2WavPath(build_code2wav(model_dir, extras), extras, noise)
    path.stage, path.pcm = path.run(REQUESTS)
    return path


@pytest.fixture(scope="module")
def runtime(plugin_on: Path, model_dir: Path, noise: torch.Tensor) -> Code2WavPath:
    """Stage 2 on this project's runtime, each reference prepared inline at chunk 0 (CAM++ on
    ONNX Runtime, as vLLM-Omni's own preparation runs it)."""
    extras = {**CONNECTOR, "batched_code2wav": True, "reference_prep_workers": 0,
              "campplus_backend": "onnxruntime"}
    path = Code2WavPath(build_code2wav(model_dir, extras), extras, noise)
    path.stage, path.pcm = path.run(REQUESTS)
    return path


def test_own_path_is_vllm_omnis_and_equals_the_engine(
    own: Code2WavPath, our_models: Any, noise: torch.Tensor
) -> None:
    assert type(own.model.backend) is BatchedToken2Wav
    assert own.stage is not None
    # The window contract the runtime's adapter relies on: 3 tokens of left context (silence
    # before the first window) and 25 new tokens, the last window the remainder.
    for request in REQUESTS:
        windows = own.stage.windows[request.rid]
        assert windows[:-1] == [28] * (len(windows) - 1), (request.rid, windows)
        assert sum(windows) - 3 * len(windows) == len(request.tokens), (request.rid, windows)
    streams = []
    for request in REQUESTS:
        features = own.model.backend.prepare_prompt(*own.reference(request))
        streams.append((request.rid, voice_from_features(features, CPU), request.tokens))
    assert_close(own.pcm, engine_direct(our_models, noise, streams))


def test_runtime_behind_the_plugin_equals_vllm_omnis_own_path(
    runtime: Code2WavPath, own: Code2WavPath
) -> None:
    backend = runtime.model.backend
    assert isinstance(backend, Code2WavBackend)
    assert_close(runtime.pcm, own.pcm)
    # Finished requests leave no stream behind in the engine.
    assert backend.engine.num_streams == 0
    assert runtime.stage is not None and own.stage is not None
    assert runtime.stage.windows == own.stage.windows


def test_reference_preparation_and_precapture_behind_the_plugin(
    plugin_on: Path, model_dir: Path, our_models: Any, noise: torch.Tensor
) -> None:
    extras = {**CONNECTOR, "batched_code2wav": True, "reference_prep_workers": 2,
              "cfm_graph_precapture": True}
    path = Code2WavPath(build_code2wav(model_dir, extras), extras, noise)
    backend = path.model.backend
    try:
        assert isinstance(backend, Code2WavBackend) and backend.prep is not None
        plugin_doc = json.loads((plugin_on / "plugin.json").read_text())
        assert plugin_doc["options"]["reference_prep_workers"] == 2
        precapture = json.loads((plugin_on / "precapture.json").read_text())
        assert precapture["state"] == "done", precapture
        _, pcm = path.run(REQUESTS)
        counts = backend.prep.counters.snapshot()
        assert counts["failed"] == 0 and counts["ahead"] + counts["cached"] + counts["late"] > 0
    finally:
        backend.close()

    # The engine directly, on this project's own preparation of the WAV vLLM-Omni wrote.
    speaker = make_speaker("torch", our_models.campplus, our_models.campplus_onnx, CPU)
    half = DeviceHalf(our_models.tokenizer, speaker, CPU)
    streams = []
    for request in REQUESTS:
        _, wav = path.reference(request)
        voice = half.run(prepare_host(Path(wav).read_bytes(), our_models.up_rate))
        streams.append((request.rid, voice, request.tokens))
    assert_close(pcm, engine_direct(our_models, noise, streams))


def test_a_final_window_longer_than_a_chunk_is_decoded_in_chunks(
    runtime: Code2WavPath, own: Code2WavPath, our_models: Any, noise: torch.Tensor
) -> None:
    """A Talker that hands over 7 tokens at a time, the last of them with its finish, can leave
    25 to 31 tokens for vLLM-Omni's final window. Its own path vocodes that window whole; the
    runtime's engine cuts it into 25-token chunks, as the reference's streaming does. The
    audio up to that window is identical, and so is its length."""
    requests = [Request(f"burst-{r.rid}", r.tokens, r.ref, r.ref_rate) for r in REQUESTS[:3]]
    theirs, their_pcm = own.run(requests, burst=(7,), finish_with_last=True)
    ours, our_pcm = runtime.run(requests, burst=(7,), finish_with_last=True)
    assert ours.windows == theirs.windows
    assert max(w[-1] for w in ours.windows.values()) > 28, ours.windows

    streams = []
    for request in requests:
        features = own.model.backend.prepare_prompt(*own.reference(request))
        streams.append((request.rid, voice_from_features(features, CPU), request.tokens))
    assert_close(our_pcm, engine_direct(our_models, noise, streams, finish_with_last=True))
    for request in requests:
        rid = request.rid
        before_last = sum(len(p) for p in theirs.pcm[rid][:-1])
        assert our_pcm[rid].shape == their_pcm[rid].shape, rid
        head = np.abs(our_pcm[rid][:before_last] - their_pcm[rid][:before_last])
        assert float(head.max()) <= TOL, rid


# Eight distinct voices whose windows meet at Talker tick 49: two continuing windows, four
# first windows and two last windows in one forward.
EIGHT = [
    Request(f"r{i}", utterance(n, 30 + i), voice_like(2.0 + 0.2 * i, rate, seed=40 + i), rate,
            start=start)
    for i, (n, start, rate) in enumerate([
        (131, 0, 16000), (77, 25, 24000), (49, 0, 16000), (60, 25, 24000),
        (90, 0, 16000), (40, 25, 24000), (39, 10, 16000), (100, 25, 24000),
    ])
]


@pytest.fixture(scope="module")
def eight_own(own: Code2WavPath) -> dict[str, np.ndarray]:
    """vLLM-Omni's own PCM of ``EIGHT``."""
    return own.run(EIGHT)[1]


def test_one_forward_of_eight_voices_is_one_engine_step(
    runtime: Code2WavPath, eight_own: dict[str, np.ndarray]
) -> None:
    their_pcm = eight_own
    ours, our_pcm = runtime.run(EIGHT)
    assert_close(our_pcm, their_pcm)
    everyone = [rids for rids, _ in ours.forwards if len(rids) == len(EIGHT)]
    assert everyone, [rids for rids, _ in ours.forwards]
    # the engine's own step counter: one step for every stage-2 step, whatever it holds
    assert [steps for _, steps in ours.forwards] == [1] * len(ours.forwards)
    backend = runtime.model.backend
    assert isinstance(backend, Code2WavBackend)
    assert backend.engine.num_streams == 0 and backend.waiting_streams == 0


def test_beyond_max_num_seqs_requests_wait_and_an_abort_frees_its_slot(
    plugin_on: Path, model_dir: Path, own: Code2WavPath, noise: torch.Tensor
) -> None:
    """Stage 2 scheduled with ``max_num_seqs: 2`` and three requests at once: the third waits
    for a slot; the first is aborted mid-stream, which frees its slot, and the third then
    completes with the audio vLLM-Omni's own path gives it."""
    extras = {**CONNECTOR, "batched_code2wav": True, "reference_prep_workers": 2,
              "campplus_backend": "onnxruntime"}
    path = Code2WavPath(build_code2wav(model_dir, extras, max_num_seqs=2), extras, noise)
    backend = path.model.backend
    assert isinstance(backend, Code2WavBackend)
    assert backend.engine.config.max_streams == 2
    requests = [EIGHT[0], EIGHT[4], EIGHT[2]]
    waited = "minicpm_speech_code2wav_slot_wait_seconds_sum"
    waited_before = REGISTRY.get_sample_value(waited) or 0.0
    try:
        stage = Stage2(path.model, extras)
        stage.aborts[EIGHT[0].rid] = 30
        with fixed_vocoder_noise():
            our_pcm = stage.run(requests)
        assert (REGISTRY.get_sample_value(waited) or 0.0) > waited_before  # the third waited
        reference = Stage2(own.model, own.extras)
        reference.aborts[EIGHT[0].rid] = 30
        with fixed_vocoder_noise():
            their_pcm = reference.run(requests)
        assert_close(our_pcm, their_pcm)
        engine = backend.engine
        assert engine.counters.ended["cancelled"] == 1
        assert engine.counters.ended["done"] == 2
        # back to the baseline: no stream, no waiting, every slot free, and the prepared
        # voices are those vLLM-Omni still caches (its default voice and its prompt cache)
        assert engine.num_streams == 0 and backend.waiting_streams == 0
        assert engine.free_slots == 2
        assert backend.prep is not None
        assert backend.prep.wait_idle(60)
        held = {entry.cache_id for entry in path.model._runtime_prompts.values()}
        pinned = set().union(*backend.prep.pins().values())
        assert pinned <= held | {path.model._normalized_default_prompt()[1]}
    finally:
        backend.close()


def test_voices_are_prepared_from_arrival_before_their_first_window(
    plugin_on: Path, model_dir: Path, own: Code2WavPath, noise: torch.Tensor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four requests arrive at once, each with its own voice, spooled as vLLM-Omni's
    orchestrator hands it over; the Talker then takes 25 ticks of 100 ms to each first window
    (two of them start 25 ticks later). Stage 2 prepares every voice from its arrival, so chunk
    0 finds all four prepared (and the audio is vLLM-Omni's own); the arrival-to-prepared time
    is measured against the arrival-to-first-window time. vLLM-Omni normalises each voice once,
    at arrival: chunk 0 does not do it again on the forward's path."""
    requests = EIGHT[:4]
    extras = {**CONNECTOR, "batched_code2wav": True, "reference_prep_workers": 2,
              "campplus_backend": "onnxruntime", "token2wav_runtime_prompt_cache_size": 16}
    path = Code2WavPath(build_code2wav(model_dir, extras), extras, noise)
    backend = path.model.backend
    assert isinstance(backend, Code2WavBackend) and backend.prep is not None
    lead = "minicpm_speech_reference_arrival_to_{}_seconds_{}"

    def leads() -> dict[str, float]:
        return {f"{k}_{part}": REGISTRY.get_sample_value(lead.format(k, part)) or 0.0
                for k in ("prepared", "first_window") for part in ("sum", "count")}

    module = sys.modules[type(path.model).__module__]
    normalised: list[int] = []
    normalise = module._normalize_reference

    def counted(ref_audio: Any, *args: Any, **kwargs: Any) -> Any:
        normalised.append(int(np.asarray(ref_audio).size))
        return normalise(ref_audio, *args, **kwargs)

    # Chunk 0 waits for a job that is still running rather than racing it: the verdict is
    # whether preparation started at arrival, not how fast this machine prepares. A voice whose
    # preparation did not start at arrival has no job, so it still comes out "inline".
    prep, acquire = backend.prep, backend.prep.acquire

    def acquire_once_ready(cache_id: str, data: bytes | None = None) -> Any:
        deadline = time.monotonic() + 300
        while prep.preparing(cache_id):
            assert time.monotonic() < deadline, f"{cache_id} never finished preparing"
            time.sleep(0.01)
        return acquire(cache_id, data)

    before, was = leads(), backend.prep.counters.snapshot()
    try:
        stage = Stage2(path.model, extras)
        with fixed_vocoder_noise(), monkeypatch.context() as patch:
            patch.setattr(module, "_normalize_reference", counted)
            patch.setattr(prep, "acquire", acquire_once_ready)
            our_pcm = stage.run(requests, tick_s=0.1)
        assert sorted(normalised) == sorted(r.ref.size for r in requests)
        assert backend.prompt_memo.hits == len(requests)
        after, now = leads(), backend.prep.counters.snapshot()
        got = {k: now[k] - was[k] for k in now if now[k] != was[k]}
        assert got == {"ahead": len(requests)}, got
        n = after["prepared_count"] - before["prepared_count"]
        assert n == after["first_window_count"] - before["first_window_count"] == len(requests)
        to_prepared = (after["prepared_sum"] - before["prepared_sum"]) / n
        to_first_window = (after["first_window_sum"] - before["first_window_sum"]) / n
        print(f"arrival to prepared {to_prepared * 1e3:.0f} ms, to first window "
              f"{to_first_window * 1e3:.0f} ms (mean of {n:.0f})")
        assert 0.0 < to_prepared < to_first_window
        their = Stage2(own.model, own.extras)
        with fixed_vocoder_noise():
            assert_close(our_pcm, their.run(requests))
        assert list((plugin_on / "arrivals").glob("*.ref")) == []
    finally:
        backend.close()


def test_a_silent_reference_fails_its_request_alone(
    runtime: Code2WavPath, eight_own: dict[str, np.ndarray], plugin_on: Path
) -> None:
    """One of the eight voices is silence, which vLLM-Omni accepts and this project's
    preparation refuses. vLLM-Omni would fail the whole forward on a backend error; here that
    request alone gets no audio and a refusal record for the API server to answer its client
    with, and the other seven, in the same forwards, are vLLM-Omni's own audio."""
    silent = dataclasses.replace(EIGHT[2], ref=np.zeros_like(EIGHT[2].ref))
    requests = [*EIGHT[:2], silent, *EIGHT[3:]]
    refused = "minicpm_speech_code2wav_refused_requests_total"
    before = REGISTRY.get_sample_value(refused, {"reason": "voice"}) or 0.0
    for old in (plugin_on / "refusals").glob("*.json"):
        old.unlink()
    ours, our_pcm = runtime.run(requests)
    assert our_pcm[silent.rid].size == 0
    (record,) = (plugin_on / "refusals").glob("*.json")
    assert record.stem == silent.rid and "silent" in json.loads(record.read_text())["message"]
    assert (REGISTRY.get_sample_value(refused, {"reason": "voice"}) or 0.0) - before == 1
    assert any(silent.rid in rids and len(rids) > 1 for rids, _ in ours.forwards)
    others = {r.rid for r in requests if r is not silent}
    assert_close({r: our_pcm[r] for r in others}, {r: eight_own[r] for r in others})
    backend = runtime.model.backend
    assert isinstance(backend, Code2WavBackend)
    assert backend.engine.num_streams == 0 and backend.waiting_streams == 0


def test_a_voice_vllm_omni_cannot_normalise_fails_its_request_alone(
    runtime: Code2WavPath, eight_own: dict[str, np.ndarray], plugin_on: Path
) -> None:
    """Two of the eight voices are ones vLLM-Omni's own normalisation refuses (NaN and inf
    samples; no samples at all), raising from ``_materialize_runtime_prompt`` inside
    ``forward``: unpatched, that ends the stage-2 process. Here ``forward`` returns; those two
    requests get no audio and a refusal record each, under their request ids, for the API
    server to answer their clients with; the other six are vLLM-Omni's own audio, decoded in
    the same forwards."""
    nan = EIGHT[1].ref.copy()
    nan[[5, 50, 500]] = [np.nan, np.inf, -np.inf]
    bad = {EIGHT[1].rid: "non_finite_ref_audio", EIGHT[4].rid: "empty_ref_audio"}
    requests = [
        *EIGHT[:1], dataclasses.replace(EIGHT[1], ref=nan), *EIGHT[2:4],
        dataclasses.replace(EIGHT[4], ref=np.zeros(0, np.float32)), *EIGHT[5:],
    ]
    records = plugin_on / "refusals"
    for old in records.glob("*.json"):
        old.unlink()
    ours, our_pcm = runtime.run(requests)
    for rid in bad:
        assert our_pcm[rid].size == 0, rid
        assert any(rid in rids and len(rids) > 1 for rids, _ in ours.forwards), rid
    found = {p.stem: json.loads(p.read_text()) for p in records.glob("*.json")}
    assert {rid: doc["reason"] for rid, doc in found.items()} == bad
    others = {r.rid for r in requests if r.rid not in bad}
    assert_close({r: our_pcm[r] for r in others}, {r: eight_own[r] for r in others})
    backend = runtime.model.backend
    assert isinstance(backend, Code2WavBackend)
    assert backend.engine.num_streams == 0 and backend.waiting_streams == 0
