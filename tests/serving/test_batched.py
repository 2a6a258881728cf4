"""The serving backend on this project's batched engine (CPU, tiny checkpoint, fp32, TF32 off).

A request's tokens pushed through :class:`Code2WavBackend`'s five methods the way vLLM-Omni's
``MiniCPMO45Code2Wav`` pushes them (windows of 25 new + 3 lookahead tokens overlapping by 3,
the last window the remainder) come out as the PCM of the engine driven directly; the engine's
counters and graph stats reach the metrics; unsupported extras are refused with one line.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from minicpm_speech_contract.extras import Code2WavExtras, first_problem
from minicpm_speech_runtime.bench.parity import (
    TOL,
    drain,
    engine,
    fixed_nsf_noise,
    make_voices,
    small_models,
    utterance,
)
from minicpm_speech_runtime.engine import Code2WavEngine, EngineConfig
from minicpm_speech_runtime.engine.graphs import Body, EagerBackend
from minicpm_speech_runtime.serving.backend import Code2WavBackend
from minicpm_speech_runtime.serving.batched import (
    UnsupportedOption,
    engine_config,
    voice_from_features,
)
from minicpm_speech_runtime.serving.metrics import RuntimeMetrics
from minicpm_speech_runtime.voice.wav import BadReference
from prometheus_client import CollectorRegistry

CPU = torch.device("cpu")


@dataclass(frozen=True)
class PromptFeatures:  # vLLM-Omni's fields
    cache_key: tuple[str, str]
    speech_tokens: torch.Tensor
    speaker_embedding: torch.Tensor
    mels: torch.Tensor


class CountingBackend(EagerBackend):
    """Runs "graphs" eagerly, so the CPU drives the engine's graph path and its counters."""

    def capture(self, body: Body) -> Body:
        body()
        return body


@pytest.fixture(scope="module")
def setup(models):  # type: ignore[no-untyped-def]
    small = small_models(models)
    return small, make_voices(small, [2.0, 3.3])


def features_of(voice: Any, name: str) -> PromptFeatures:
    return PromptFeatures((name, f"/spool/{name}.wav"), voice.prompt_tokens, voice.spk_emb,
                          voice.prompt_mels)


def windows(tokens: list[int]) -> list[tuple[list[int], bool]]:
    """vLLM-Omni's decode windows of one request: 28 tokens overlapping by 3, then the rest."""
    out = []
    while len(tokens) >= 28:
        out.append((tokens[:28], False))
        tokens = tokens[25:]
    out.append((tokens, True))
    return out


def make_backend(small: Any, metrics: RuntimeMetrics, features: dict[str, Any],
                 graphs: bool = False, **cfg: Any) -> Code2WavBackend:
    eng = engine(small, **cfg)
    if graphs:
        eng = Code2WavEngine(small, eng.config, graph_backend=CountingBackend())
    return Code2WavBackend(
        eng,
        Code2WavExtras(batched_code2wav=True, cfm_max_graphs=eng.config.graph_budget),
        metrics,
        CPU,
        make_features=lambda key, voice: voice,
        inline_prepare=lambda cache_id, wav: features[cache_id],
    )


def one_voice_backend(setup: Any) -> tuple[Code2WavBackend, Any]:
    """A backend with fresh metrics and the prepared features of voice ``v0``."""
    small, voices = setup
    feats = {"v0": features_of(voices[0], "v0")}
    backend = make_backend(small, RuntimeMetrics(CollectorRegistry()), feats)
    return backend, backend.prepare_prompt("v0", "/spool/v0.wav")


def direct(small: Any, voices: list[Any], plan: list[tuple[str, int, list[int]]],
           **cfg: Any) -> dict[str, np.ndarray]:
    eng = engine(small, **cfg)
    for sid, v, toks in plan:
        eng.add_stream(sid, voices[v])
        eng.push_tokens(sid, toks, last=True)
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    for _ in drain(eng, got, reasons):
        pass
    assert set(reasons.values()) == {"done"}
    return {sid: np.concatenate(got[sid]) for sid, *_ in plan}


def test_backend_pcm_equals_engine_driven_directly(setup) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    feats = {"v0": features_of(voices[0], "v0"), "v1": features_of(voices[1], "v1")}
    # Two requests of voice v0 with equal lengths (one decode_batch per window, as vLLM-Omni
    # batches a bucket of one prompt), two of v1 with different lengths (decode_ragged_batch).
    plan = [("a", 0, utterance(131, 1)), ("b", 0, utterance(131, 2)),
            ("c", 1, utterance(77, 3)), ("d", 1, utterance(30, 4))]
    registry = CollectorRegistry()
    metrics = RuntimeMetrics(registry)
    with fixed_nsf_noise():
        want = direct(small, voices, plan)
        backend = make_backend(small, metrics, feats)
        f0 = backend.prepare_prompt("v0", "/spool/v0.wav")
        f1 = backend.prepare_prompt("v1", "/spool/v1.wav")
        got: dict[str, list[torch.Tensor]] = {sid: [] for sid, *_ in plan}
        states_ab = backend.setup_batch(f0, 2)
        states_cd = backend.setup_batch(f1, 2)
        assert backend.engine.num_streams == 4
        wa, wb = windows(plan[0][2]), windows(plan[1][2])
        wc, wd = windows(plan[2][2]), windows(plan[3][2])
        for i in range(max(len(wa), len(wc), len(wd))):
            if i < len(wa):
                tokens = torch.tensor([wa[i][0], wb[i][0]])
                audios, states_ab = backend.decode_batch(tokens, f0, states_ab,
                                                         last_chunk=wa[i][1])
                got["a"].append(audios[0])
                got["b"].append(audios[1])
            rows, lasts, states, sids = [], [], [], []
            for sid, w, st in (("c", wc, states_cd[0]), ("d", wd, states_cd[1])):
                if i < len(w):
                    rows.append(torch.tensor(w[i][0]))
                    lasts.append(w[i][1])
                    states.append(st)
                    sids.append(sid)
            if rows:
                audios, _ = backend.decode_ragged_batch(rows, f1, states, last_chunks=lasts)
                for sid, audio in zip(sids, audios, strict=True):
                    got[sid].append(audio)
    for sid, *_ in plan:
        pcm = torch.cat(got[sid]).numpy()
        assert pcm.shape == want[sid].shape, sid
        assert float(np.abs(pcm - want[sid]).max()) <= TOL, sid
    assert all(h.finished and h.reason == "done" for h in states_ab)
    assert backend.engine.num_streams == 0

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    # Setups ran inside the engine's steps: one solve per voice, its second stream a copy.
    assert value("minicpm_speech_code2wav_setup_streams_total", mode="batched") == 2
    assert value("minicpm_speech_code2wav_setup_streams_total", mode="copied") == 2
    assert value("minicpm_speech_code2wav_setup_solves_total", mode="batched") >= 1
    assert value("minicpm_speech_code2wav_active_streams") == 0
    first = value("minicpm_speech_code2wav_chunk_duration_seconds_count", chunk="first")
    steady = value("minicpm_speech_code2wav_chunk_duration_seconds_count", chunk="steady")
    assert first == 2 and first + steady == len(wa) + len(wc)


def test_graph_stats_and_precapture_reach_metrics(setup) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    feats = {"v0": features_of(voices[0], "v0")}
    registry = CollectorRegistry()
    metrics = RuntimeMetrics(registry)
    with fixed_nsf_noise():
        backend = make_backend(small, metrics, feats, graphs=True, max_streams=2,
                               micro_batch=2, graph_budget=5)
        document = backend.precapture("v0", "/spool/v0.wav")
    stats = backend.engine.graph_stats()
    assert document["state"] == "done" and document["graph_stats"] == stats
    assert document["captured"] == stats["graphs"] == 5  # the budget is full: refusals follow
    assert stats["refusals"] > 0

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    assert value("minicpm_speech_code2wav_graph_captures_total", kind="all") == 5
    assert value("minicpm_speech_code2wav_graph_replays_total", kind="all") == stats["replays"] > 0
    assert value("minicpm_speech_code2wav_graph_refusals_total", kind="all") == stats["refusals"]
    for kind, n in stats["eager"].items():
        assert value("minicpm_speech_code2wav_eager_fallbacks_total", kind=kind) == n
    assert value("minicpm_speech_code2wav_graph_budget_used") == 5
    assert value("minicpm_speech_code2wav_graph_budget_limit") == 5
    assert value("minicpm_speech_code2wav_setup_streams_total", mode="batched") == 1


def test_dropped_request_is_cancelled(setup) -> None:  # type: ignore[no-untyped-def]
    backend, f0 = one_voice_backend(setup)
    with fixed_nsf_noise():
        kept = backend.setup_batch(f0, 1)
        dropped = backend.setup_batch(f0, 1)
        backend.decode_batch(torch.tensor([utterance(28, 5)]), f0, dropped, last_chunk=False)
        del dropped  # vLLM-Omni forgets an aborted request's state
        backend.decode_batch(torch.tensor([utterance(28, 6)]), f0, kept, last_chunk=False)
    assert backend.engine.num_streams == 1
    assert backend.engine.counters.ended["cancelled"] == 1


def test_handles_of_one_voice_fall_in_one_vllm_omni_bucket(setup) -> None:  # type: ignore[no-untyped-def]
    """vLLM-Omni buckets a step's continuing requests by the names and tensor shapes of their
    states' ``flow_cache`` and ``hift_cache``; a handle's caches live in the engine."""
    backend, f0 = one_voice_backend(setup)
    with fixed_nsf_noise():
        states = backend.setup_batch(f0, 2)
        _, states = backend.decode_batch(torch.tensor([utterance(28, 7)] * 2), f0, states,
                                         last_chunk=False)
    signatures = {
        tuple((name, tuple(cache[name].shape)) for name in sorted(cache))
        for h in states for cache in (h.flow_cache, h.hift_cache)
    }
    assert signatures == {()}


def test_engine_config_maps_the_extras() -> None:
    extras = {"batched_code2wav": True, "micro_batch_size": 4, "cfm_max_graphs": 32,
              "cfm_graph_precapture": True, "token2wav_allow_tf32": True,
              "token2wav_float16": False, "token2wav_n_timesteps": 8,
              "ref_audio_max_seconds": 7.3}
    cfg = engine_config(extras, CPU)
    assert (cfg.micro_batch, cfg.graph_budget, cfg.precapture, cfg.tf32, cfg.n_timesteps) == (
        4, 32, True, True, 8)
    assert cfg.max_prompt_frames == 366 and cfg.max_streams == 8
    # vLLM-Omni ends its requests; a stage 1 slow to send a window must not end one.
    assert cfg.idle_timeout_s == 600.0
    assert not cfg.cuda_graphs  # CPU
    assert engine_config({"micro_batch_size": 16}, CPU).max_streams == 16
    # the stage's max_num_seqs is the capacity, and no setup group is larger
    narrow = engine_config({"micro_batch_size": 8}, CPU, max_streams=2)
    assert (narrow.max_streams, narrow.micro_batch) == (2, 2)
    assert engine_config({"micro_batch_size": 8}, CPU, max_streams=32).max_streams == 32
    assert cfg.precision == "fp32"
    for precision in ("bf16-cache", "bf16"):
        assert engine_config({"token2wav_precision": precision}, CPU).precision == precision
    with pytest.raises(UnsupportedOption, match="token2wav_precision"):
        engine_config({"token2wav_precision": "fp16"}, CPU)
    assert engine_config({"enable_cfm_graph": False}, torch.device("cuda")).cuda_graphs is False
    assert engine_config({}, CPU).vocoder_graphs is True
    assert engine_config({"enable_hift_graph": False}, CPU).vocoder_graphs is False
    assert engine_config({}, CPU).cache_mib is None  # every slot at the longest prompt
    assert engine_config({"token2wav_cache_mib": 2048}, CPU).cache_mib == 2048
    with pytest.raises(UnsupportedOption, match="token2wav_cache_mib"):
        engine_config({"token2wav_cache_mib": 64}, CPU)  # not one stream of a 10 s prompt
    assert engine_config({}, CPU).setup_cache_voices is None
    assert engine_config({"token2wav_setup_cache_size": 0}, CPU).setup_cache_voices == 0
    assert isinstance(engine_config({}, CPU), EngineConfig)


def test_the_stage_extras_carry_vllm_omnis_own_connector_keys() -> None:
    """In the stage, the extras are vLLM-Omni's base config merged with the overlay; its own
    connector settings are not this project's to refuse, while a value of ours still is."""
    base_keys = {"connector_get_max_wait": 5, "shm_threshold_bytes": 65536}
    config = engine_config({"batched_code2wav": True, "micro_batch_size": 2, **base_keys}, CPU)
    assert config.micro_batch == 2
    with pytest.raises(UnsupportedOption, match="micro_batch_size"):
        engine_config({"batched_code2wav": True, "micro_batch_size": 0, **base_keys}, CPU)


@pytest.mark.parametrize(("extra", "key", "why"), [
    ({"token2wav_float16": True}, "token2wav_float16", "is not supported"),
    ({"codec_chunk_frames": 10}, "codec_chunk_frames", "is not supported"),
    ({"codec_left_context_frames": 25}, "codec_left_context_frames", "is not supported"),
    ({"micro_batch_size": 0}, "micro_batch_size", "out of range"),
    ({"token2wav_n_timesteps": 0}, "token2wav_n_timesteps", "out of range"),
])
def test_unsupported_extras_refused_in_one_line(extra: dict[str, Any], key: str,
                                                why: str) -> None:
    with pytest.raises(UnsupportedOption) as info:
        engine_config({"batched_code2wav": True, **extra}, CPU)
    message = str(info.value)
    assert "\n" not in message and f"extra.{key}: " in message and why in message
    # the same line the pod's start-up check and the operator give
    problem = first_problem({"batched_code2wav": True, **extra})
    assert problem is not None and problem.line() == message
    if why == "is not supported":  # vLLM-Omni's own Code2Wav honours these
        assert first_problem({"batched_code2wav": False, **extra}) is None


def test_voice_from_vllm_omni_features(setup) -> None:  # type: ignore[no-untyped-def]
    _, voices = setup
    v = voices[0]
    voice = voice_from_features(features_of(v, "v0"), CPU)
    for name in ("prompt_tokens", "prompt_tokens_len", "spk_emb", "prompt_mels",
                 "prompt_mels_len"):
        assert torch.equal(getattr(voice, name), getattr(v, name)), name
    assert voice_from_features(v, CPU) is v


@dataclass(frozen=True)
class Item:
    """The fields of vLLM-Omni's ``_WorkItem`` the backend reads."""

    prompt_cache_id: str
    prompt_wav: str
    tokens: torch.Tensor
    last_chunk: bool
    previous: Any = None  # vLLM-Omni's request state: ``.token2wav`` is the handle


def vllm_omni_forward(backend: Code2WavBackend, batches: list[list[Item]]) -> list[Any]:
    """The backend calls of vLLM-Omni's forward, given its decode batches (``_iter_decode_batches``
    hands them to ``plan_forward`` first): per batch, prepare, set up or continue, decode."""
    backend.plan_forward(batches)
    out = []
    for batch in batches:
        head = batch[0]
        features = backend.prepare_prompt(head.prompt_cache_id, head.prompt_wav)
        states = (backend.setup_batch(features, len(batch)) if head.previous is None
                  else [item.previous.token2wav for item in batch])
        audios, states = backend.decode_ragged_batch(
            [item.tokens for item in batch], features, states,
            last_chunks=[item.last_chunk for item in batch])
        out += zip(batch, audios, states, strict=True)
    return out


def serve(backend: Code2WavBackend, requests: dict[str, tuple[str, list[int], int]],
          steps_per_forward: list[int]) -> dict[str, np.ndarray]:
    """Requests (voice, tokens, forward it joins at), each with a voice of its own, through
    vLLM-Omni-like forwards: one batch per voice and new/continuing, each request's windows in
    order; returns each one's PCM."""
    rid_of = {voice: rid for rid, (voice, _, _) in requests.items()}
    assert len(rid_of) == len(requests)
    got: dict[str, list[torch.Tensor]] = {rid: [] for rid in requests}
    state: dict[str, Any] = {}
    plans = {rid: windows(tokens) for rid, (_, tokens, _) in requests.items()}
    forward = 0
    while len(state) or any(forward <= start for *_, start in requests.values()):
        batches: dict[tuple[str, bool], list[Item]] = {}
        for rid, (voice, _, start) in requests.items():
            i = forward - start
            if 0 <= i < len(plans[rid]):
                tokens, last = plans[rid][i]
                previous = state.get(rid)
                item = Item(voice, f"/spool/{voice}.wav", torch.tensor(tokens), last, previous)
                batches.setdefault((voice, previous is None), []).append(item)
        before = backend.engine.counters.steps
        for item, audio, handle in vllm_omni_forward(backend, list(batches.values())):
            rid = rid_of[item.prompt_cache_id]
            got[rid].append(audio)
            state.pop(rid, None)
            if not item.last_chunk:
                state[rid] = types.SimpleNamespace(token2wav=handle)
        steps_per_forward.append(backend.engine.counters.steps - before)
        forward += 1
    return {rid: torch.cat(parts).numpy() for rid, parts in got.items()}


@pytest.fixture(scope="module")
def four_voices(models):  # type: ignore[no-untyped-def]
    small = small_models(models)
    return small, make_voices(small, [2.0, 2.6, 3.3, 4.1])


def test_every_voice_of_a_forward_decodes_in_one_engine_step(four_voices) -> None:  # type: ignore[no-untyped-def]
    small, voices = four_voices
    feats = {f"v{i}": features_of(v, f"v{i}") for i, v in enumerate(voices)}
    # Four voices, joining at forwards 0, 0, 1 and 3: first, continuing and last windows meet.
    requests = {"a": ("v0", utterance(131, 1), 0), "b": ("v1", utterance(60, 2), 0),
                "c": ("v2", utterance(77, 3), 1), "d": ("v3", utterance(40, 4), 3)}
    registry = CollectorRegistry()
    steps: list[int] = []
    with fixed_nsf_noise():
        want = direct(small, voices, [(r, int(v[1]), t) for r, (v, t, _) in requests.items()])
        backend = make_backend(small, RuntimeMetrics(registry), feats)
        got = serve(backend, requests, steps)
    assert steps == [1] * len(steps)  # one engine step per forward, whatever the voices
    for rid in requests:
        assert got[rid].shape == want[rid].shape, rid
        assert float(np.abs(got[rid] - want[rid]).max()) <= TOL, rid
    assert backend.engine.num_streams == 0 and backend.waiting_streams == 0
    value = registry.get_sample_value
    assert value("minicpm_speech_code2wav_forwards_total") == len(steps)
    assert value("minicpm_speech_code2wav_engine_steps_total", {"reason": "forward"}) == len(steps)
    assert value("minicpm_speech_code2wav_engine_steps_total", {"reason": "final_window"}) == 0


def test_a_request_beyond_capacity_waits_for_a_slot_and_completes(four_voices) -> None:  # type: ignore[no-untyped-def]
    small, voices = four_voices
    feats = {f"v{i}": features_of(v, f"v{i}") for i, v in enumerate(voices)}
    # Two slots, three requests at once: "c" waits until "a" ends, then catches up.
    requests = {"a": ("v0", utterance(60, 5), 0), "b": ("v1", utterance(131, 6), 0),
                "c": ("v2", utterance(77, 7), 0)}
    registry = CollectorRegistry()
    steps: list[int] = []
    with fixed_nsf_noise():
        want = direct(small, voices, [(r, int(v[1]), t) for r, (v, t, _) in requests.items()])
        backend = make_backend(small, RuntimeMetrics(registry), feats, max_streams=2,
                               micro_batch=2)
        got = serve(backend, requests, steps)
    for rid in requests:
        assert got[rid].shape == want[rid].shape, rid
        assert float(np.abs(got[rid] - want[rid]).max()) <= TOL, rid
    assert backend.engine.num_streams == 0 and backend.waiting_streams == 0
    value = registry.get_sample_value
    # "c" got its last window while waiting: the forward that freed a slot finished it
    assert value("minicpm_speech_code2wav_engine_steps_total", {"reason": "final_window"}) > 0
    assert max(steps) > 1
    assert value("minicpm_speech_code2wav_slot_wait_seconds_count") == 3
    assert value("minicpm_speech_code2wav_waiting_streams") == 0


def test_a_refused_voice_fails_its_requests_alone(four_voices) -> None:  # type: ignore[no-untyped-def]
    """One forward: a voice the engine cannot set up (too long), a reference preparation
    refuses (silent) and a good one. The forward goes on: the good request decodes in the same
    step, the other two get no audio, now or in their later windows, and are counted."""
    small, voices = four_voices
    feats = {"v0": features_of(voices[0], "v0"), "v3": features_of(voices[3], "v3")}
    registry = CollectorRegistry()
    backend = make_backend(small, RuntimeMetrics(registry), feats,
                           max_prompt_frames=120)  # v3's 4.1 s prompt does not fit

    def silent(cache_id: str, wav: str) -> Any:
        if cache_id == "quiet":
            raise BadReference("silent", "peak below -80 dBFS")
        return feats[cache_id]

    backend.inline_prepare = silent
    tokens = utterance(60, 8)
    first = {v: [Item(v, f"/spool/{v}.wav", torch.tensor(tokens[:28]), False)]
             for v in ("v3", "quiet", "v0")}
    with fixed_nsf_noise():
        out = vllm_omni_forward(backend, list(first.values()))
        audio = {item.prompt_cache_id: a for item, a, _ in out}
        assert audio["v0"].numel() > 0 and audio["v3"].numel() == audio["quiet"].numel() == 0
        assert backend.engine.num_streams == 1 and backend.engine.counters.steps == 1
        handles = {item.prompt_cache_id: h for item, _, h in out}
        assert handles["v3"].finished and handles["quiet"].finished
        later = [[Item(v, f"/spool/{v}.wav", torch.tensor(tokens[25:]), True,
                       types.SimpleNamespace(token2wav=handles[v]))] for v in first]
        out = vllm_omni_forward(backend, later)
    audio = {item.prompt_cache_id: a for item, a, _ in out}
    assert audio["v0"].numel() > 0 and audio["v3"].numel() == audio["quiet"].numel() == 0
    value = registry.get_sample_value
    assert value("minicpm_speech_code2wav_refused_requests_total", {"reason": "voice"}) == 2
    assert backend.engine.num_streams == 0 and backend.waiting_streams == 0


def test_a_token_outside_the_codebook_ends_its_own_stream(four_voices) -> None:  # type: ignore[no-untyped-def]
    small, voices = four_voices
    feats = {f"v{i}": features_of(voices[i], f"v{i}") for i in (0, 1)}
    registry = CollectorRegistry()
    backend = make_backend(small, RuntimeMetrics(registry), feats)
    good, bad = utterance(28, 10), utterance(28, 11)
    bad[5] = 99_999
    batches = [[Item("v0", "/spool/v0.wav", torch.tensor(good), True)],
               [Item("v1", "/spool/v1.wav", torch.tensor(bad), True)]]
    with fixed_nsf_noise():
        out = vllm_omni_forward(backend, batches)
    audio = {item.prompt_cache_id: a for item, a, _ in out}
    assert audio["v0"].numel() > 0 and audio["v1"].numel() == 0
    value = registry.get_sample_value
    assert value("minicpm_speech_code2wav_refused_requests_total", {"reason": "tokens"}) == 1
    assert backend.engine.num_streams == 0


def test_a_failure_that_is_not_the_requests_is_raised_at_its_batch(four_voices) -> None:  # type: ignore[no-untyped-def]
    """Anything but the request's own input (here, preparation breaking) is vLLM-Omni's to
    handle: it is raised where vLLM-Omni calls the backend for that batch."""
    small, voices = four_voices
    feats = {"v0": features_of(voices[0], "v0")}
    backend = make_backend(small, RuntimeMetrics(CollectorRegistry()), feats)

    def broken(cache_id: str, wav: str) -> Any:
        if cache_id == "v1":
            raise RuntimeError("CUDA error: out of memory")
        return feats[cache_id]

    backend.inline_prepare = broken
    good = [Item("v0", "/spool/v0.wav", torch.tensor(utterance(28, 8)), False)]
    bad = [Item("v1", "/spool/v1.wav", torch.tensor(utterance(28, 9)), False)]
    with fixed_nsf_noise():
        backend.plan_forward([bad, good])
        with pytest.raises(RuntimeError, match="out of memory"):
            backend.prepare_prompt("v1", "/spool/v1.wav")  # where vLLM-Omni meets that batch
        f0 = backend.prepare_prompt("v0", "/spool/v0.wav")
        [handle] = backend.setup_batch(f0, 1)
        audios, _ = backend.decode_ragged_batch([good[0].tokens], f0, [handle],
                                                last_chunks=[False])
    assert audios[0].numel() > 0  # the good batch was stepped in the same forward
    assert backend.engine.num_streams == 1 and backend.engine.counters.steps == 1
