"""Batched encoder == the per-stream path, outputs and caches, after every step.

The per-stream path is the runner's: ``input_embedding`` -> ``encoder.forward_chunk`` -> cut the
attention cache to prompt + 100 -> ``encoder_proj``. Voices of 50, 116 and 206 prompt frames
(below and above the 100-frame window, whose cut differs); ragged batches (prompts beside
chunks, a fresh stream beside a deep one, short last chunks beside full ones); the tiny
checkpoint's encoder and a deeper one; float64, where only rounding may differ; slot
bookkeeping and rejected inputs; an operator count that does not grow with the batch.
"""

from __future__ import annotations

import copy
import gc
from typing import Any

import pytest
import torch
from minicpm_speech_runtime.bench.parity import make_voices, utterance
from minicpm_speech_runtime.engine.config import HISTORY_FRAMES, LOOKAHEAD_TOKENS, PROMPT_PAD_TOKEN
from minicpm_speech_runtime.engine.encoder import BatchedEncoder, EncoderCache
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

OUT_TOL = 1e-5
# Cached conv inputs reach ~20 in the tiny model, where one float32 ulp is ~2e-6: a pure
# absolute bound of 1e-5 would be a handful of ulps, so caches get a relative term as well.
CACHE_TOL: dict[str, Any] = {"rtol": 1e-5, "atol": 1e-5}
MAX_PROMPT = 300


class _Flow(nn.Module):
    """The flow's token path around another encoder."""

    def __init__(self, flow: nn.Module, encoder: nn.Module) -> None:
        super().__init__()
        self.input_embedding = flow.input_embedding
        self.encoder = encoder
        self.encoder_proj = flow.encoder_proj


@pytest.fixture(scope="module", params=["tiny", "deep"])
def flow(request, models) -> Any:  # type: ignore[no-untyped-def]
    if request.param == "tiny":
        return models.flow
    from stepaudio2.cosyvoice2.transformer.upsample_encoder_v2 import (
        UpsampleConformerEncoderV2,
    )

    width = models.flow.encoder.output_size()
    torch.manual_seed(7)
    deep = UpsampleConformerEncoderV2(
        input_size=width,
        output_size=width,
        num_blocks=2,
        num_up_blocks=2,
        attention_heads=4,
        linear_units=2 * width,
    )
    return _Flow(models.flow, deep).eval()


@pytest.fixture(scope="module")
def voices(models):  # type: ignore[no-untyped-def]
    return make_voices(models, [1.0, 2.3, 4.1])  # 50, 116, 206 prompt frames


class _Stream:
    """One stream on both paths: the reference's caches and the batched encoder's."""

    def __init__(self, enc: BatchedEncoder, flow: Any, prompt_frames: int) -> None:
        self.flow, self.prompt_frames = flow, prompt_frames
        self.cache: EncoderCache = enc.new_cache()
        self.cnn: torch.Tensor | None = None
        self.att: torch.Tensor | None = None

    @torch.inference_mode()
    def reference(self, tokens: torch.Tensor, last: bool) -> torch.Tensor:
        xs = self.flow.input_embedding(tokens.view(1, -1))
        h, self.cnn, att = self.flow.encoder.forward_chunk(xs, last, self.cnn, self.att)
        self.att = _cut(att, self.prompt_frames)
        mu: torch.Tensor = self.flow.encoder_proj(h)[0].transpose(0, 1)
        return mu


def _cut(att: torch.Tensor, prompt: int) -> torch.Tensor:
    """The reference's history cut along time: the first ``prompt`` and the last 100."""
    if att.shape[3] <= prompt + HISTORY_FRAMES:
        return att
    return torch.cat([att[:, :, :, :prompt], att[:, :, :, -HISTORY_FRAMES:]], dim=3)


def _prompt(voice: Any) -> torch.Tensor:
    tok = voice.prompt_tokens
    pad = torch.full((1, LOOKAHEAD_TOKENS), PROMPT_PAD_TOKEN, dtype=tok.dtype)
    return torch.cat([tok, pad], dim=1)


def _step(
    enc: BatchedEncoder,
    streams: list[_Stream],
    tokens: list[torch.Tensor],
    last: list[bool] | None = None,
    tol: float = OUT_TOL,
) -> None:
    """One batched call against each stream's reference call; outputs and caches compared."""
    last = last or [False] * len(streams)
    want = [s.reference(t, z) for s, t, z in zip(streams, tokens, last, strict=True)]
    got = enc.encode([s.cache for s in streams], tokens, last, [s.prompt_frames for s in streams])
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape
        assert float((g - w).abs().max()) <= tol
    cache_tol = CACHE_TOL if tol == OUT_TOL else {"rtol": tol, "atol": tol}
    for s in streams:
        cnn, att = enc.reference_caches(s.cache)
        assert s.cnn is not None and s.att is not None
        assert cnn.shape == s.cnn.shape and att.shape == s.att.shape
        torch.testing.assert_close(cnn, s.cnn, **cache_tol)
        torch.testing.assert_close(att, s.att, **cache_tol)


def _chunk(seed: int, n: int = 28) -> torch.Tensor:
    return torch.tensor(utterance(n, seed))


def _setup(enc: BatchedEncoder, flow: nn.Module, voices: list[Any]) -> list[_Stream]:
    streams = [_Stream(enc, flow, int(v.prompt_mels.shape[1])) for v in voices]
    _step(enc, streams, [_prompt(v) for v in voices])
    return streams


def test_prompts_set_up_together(flow, voices) -> None:  # type: ignore[no-untyped-def]
    enc = BatchedEncoder(flow, torch.device("cpu"), 4, MAX_PROMPT)
    streams = _setup(enc, flow, voices)
    assert [s.cache.length for s in streams] == [50, 116, 206]
    for k in range(2):
        _step(enc, streams, [_chunk(10 * k + i) for i in range(3)])


def test_chunks_past_the_history_window(flow, voices) -> None:  # type: ignore[no-untyped-def]
    enc = BatchedEncoder(flow, torch.device("cpu"), 3, MAX_PROMPT)
    streams = _setup(enc, flow, voices)
    for k in range(9):
        _step(enc, streams, [_chunk(100 + 10 * k + i) for i in range(3)])
    assert [s.cache.length for s in streams] == [s.prompt_frames + 100 for s in streams]
    _step(enc, streams, [_chunk(7, 3), _chunk(8, 11), _chunk(9, 26)], [True] * 3)


def test_fresh_and_deep_streams_in_one_batch(flow, voices) -> None:  # type: ignore[no-untyped-def]
    enc = BatchedEncoder(flow, torch.device("cpu"), 2, MAX_PROMPT)
    (deep,) = _setup(enc, flow, voices[2:])
    for k in range(9):
        _step(enc, [deep], [_chunk(200 + k)])
    fresh = _Stream(enc, flow, int(voices[0].prompt_mels.shape[1]))
    _step(enc, [deep, fresh], [_chunk(300), _prompt(voices[0])])
    _step(enc, [fresh, deep], [_chunk(301), _chunk(302)])
    _step(enc, [deep, fresh], [_chunk(303, 9), _chunk(304)], [True, False])
    # a slot freed by an ended stream serves the next one from a clean state
    slot = deep.cache.slot
    enc.release(deep.cache)
    again = _Stream(enc, flow, int(voices[1].prompt_mels.shape[1]))
    assert again.cache.slot == slot
    _step(enc, [fresh, again], [_chunk(305), _prompt(voices[1])])
    _step(enc, [again, fresh], [_chunk(306), _chunk(307)])


def test_last_chunks_beside_full_chunks(flow, voices) -> None:  # type: ignore[no-untyped-def]
    enc = BatchedEncoder(flow, torch.device("cpu"), 3, MAX_PROMPT)
    streams = _setup(enc, flow, voices)
    for k in range(3):
        _step(enc, streams, [_chunk(400 + 10 * k + i) for i in range(3)])
    # a one-frame last chunk leaves the reference a shorter lookahead cache; it is reproduced
    _step(enc, streams, [_chunk(450, 7), _chunk(451), _chunk(452, 1)], [True, False, True])
    assert enc.reference_caches(streams[2].cache)[0].shape[2] == 5
    with pytest.raises(ValueError):
        enc.encode([streams[2].cache], [_chunk(453)], [False], [streams[2].prompt_frames])
    _step(enc, streams[1:2], [_chunk(454, 4)], [True])


def test_single_stream(flow, voices) -> None:  # type: ignore[no-untyped-def]
    enc = BatchedEncoder(flow, torch.device("cpu"), 1, MAX_PROMPT)
    (s,) = _setup(enc, flow, voices[1:2])
    for k in range(9):
        _step(enc, [s], [_chunk(500 + k)])
    _step(enc, [s], [_chunk(510, 20)], [True])


def test_float64_leaves_only_rounding(flow, voices) -> None:  # type: ignore[no-untyped-def]
    """In float64 the two paths agree to ~1e-13: the batching changes no arithmetic."""
    flow64 = copy.deepcopy(_Flow(flow, flow.encoder)).double()
    enc = BatchedEncoder(flow64, torch.device("cpu"), 3, MAX_PROMPT)
    streams = [_Stream(enc, flow64, int(v.prompt_mels.shape[1])) for v in voices]
    _step(enc, streams, [_prompt(v) for v in voices], tol=1e-10)
    for k in range(9):
        _step(enc, streams, [_chunk(600 + 10 * k + i) for i in range(3)], tol=1e-10)
    _step(enc, streams, [_chunk(700), _chunk(701, 5), _chunk(702)], [False, True, False], 1e-10)


def test_slots_and_rejected_inputs(models) -> None:  # type: ignore[no-untyped-def]
    enc = BatchedEncoder(models.flow, torch.device("cpu"), 2, 100)
    a, b = enc.new_cache(), enc.new_cache()
    with pytest.raises(RuntimeError):
        enc.new_cache()
    del b
    gc.collect()
    assert enc.free_slots == 1
    b = enc.new_cache()
    with pytest.raises(ValueError):  # three tokens without ``last`` yield no frame
        enc.encode([a], [_chunk(0, 3)], [False], [40])
    with pytest.raises(ValueError):
        enc.encode([a], [_chunk(0, 23)], [False], [120])
    with pytest.raises(ValueError):
        enc.encode([a, a], [_chunk(0), _chunk(1)], [False, False], [40, 40])
    enc.release(a)
    enc.release(b)
    assert enc.free_slots == 2
    with pytest.raises(ValueError):
        enc.encode([a], [_chunk(0)], [False], [40])


class _CountOps(TorchDispatchMode):
    """Counts the operators that compute (views are free)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops += not func.is_view
        return func(*args, **(kwargs or {}))


def test_operator_count_does_not_grow_with_streams(models) -> None:  # type: ignore[no-untyped-def]
    def count(n: int) -> int:
        enc = BatchedEncoder(models.flow, torch.device("cpu"), n, 100)
        caches = [enc.new_cache() for _ in range(n)]
        prompts = [torch.tensor(utterance(10 + 5 * i, i)) for i in range(n)]
        enc.encode(caches, prompts, [False] * n, [2 * (len(p) - 3) for p in prompts])
        chunks = [_chunk(i, 28 if i % 2 else 9) for i in range(n)]
        with _CountOps() as c:
            enc.encode(caches, chunks, [i % 2 == 0 for i in range(n)], [40] * n)
        return int(c.ops)

    assert count(2) == count(6)


def test_rows_beyond_the_score_budget_run_in_several_calls_that_match_the_reference(
    flow: Any, voices: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst of long prompts must not ask for scores of every row at once: with a budget of
    about one row's scores, three set-ups run as three calls, and their chunks still match."""
    from minicpm_speech_runtime.engine import encoder as encoder_module

    enc = BatchedEncoder(flow, torch.device("cpu"), 3, MAX_PROMPT)
    calls: list[int] = []
    inner = enc._encode

    def counted(caches, *rest):  # type: ignore[no-untyped-def]
        calls.append(len(caches))
        return inner(caches, *rest)

    monkeypatch.setattr(enc, "_encode", counted)
    up_frames = enc.stride * _prompt(voices[2]).numel()  # the longest prompt's queries and keys
    one_row = enc.heads * up_frames * up_frames * enc.att.element_size()
    monkeypatch.setattr(encoder_module, "SCORES_BYTES", one_row)
    streams = _setup(enc, flow, voices)
    assert calls == [1, 1, 1]
    calls.clear()
    _step(enc, streams, [_chunk(40 + i) for i in range(3)])
    assert calls == [3]  # a chunk's scores are small: every row in one call
