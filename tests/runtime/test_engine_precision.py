"""Precision "bf16-cache": the estimator keeps keys, values and conv caches in bfloat16 (half
the slots' memory) and computes in fp32; streams, set-up reuse and slot moves work as in fp32,
and the audio stays close to the fp32 engine's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from minicpm_speech_runtime.bench.fidelity import fidelity
from minicpm_speech_runtime.bench.parity import (
    drain,
    engine,
    fixed_nsf_noise,
    make_voices,
    max_diff,
    small_models,
    utterance,
)
from minicpm_speech_runtime.engine import EngineConfig
from minicpm_speech_runtime.engine.graphs import EagerBackend

PRECISION_TARGET_DB = 30.0


@pytest.fixture(scope="module")
def voices(models):  # type: ignore[no-untyped-def]
    return make_voices(models, [1.0, 1.5, 2.0])


def test_bf16_caches_halve_the_estimators_memory(models) -> None:  # type: ignore[no-untyped-def]
    fp32, bf16 = engine(models), engine(models, precision="bf16-cache")
    for name in ("estimator", "setup_estimator"):
        a, b = getattr(fp32.runner, name), getattr(bf16.runner, name)
        assert {t.dtype for t in (b.k, b.v, b.conv)} == {torch.bfloat16}
        assert b.nbytes * 2 == a.nbytes
    assert next(bf16.runner.flow.parameters()).dtype == torch.float32  # compute stays fp32


@pytest.mark.parametrize("precision", ["bf16-cache", "bf16"])
def test_narrow_streams_reuse_setups_and_stay_close_to_fp32(models, voices, precision) -> None:  # type: ignore[no-untyped-def]
    eng = engine(models, precision=precision, max_streams=3, micro_batch=3)
    out: dict = {}  # type: ignore[type-arg]
    reasons: dict = {}  # type: ignore[type-arg]
    for i in range(2):
        eng.add_stream(f"s{i}", voices[i])
        eng.push_tokens(f"s{i}", utterance(40, i), last=True)
    for _ in drain(eng, out, reasons):
        pass
    eng.add_stream("again", voices[0])  # its set-up comes from the narrow setup cache
    eng.push_tokens("again", utterance(40, 0), last=True)
    for _ in drain(eng, out, reasons):
        pass
    assert reasons == {"s0": "done", "s1": "done", "again": "done"}
    assert eng.counters.setup_hits == 1
    assert all(np.isfinite(np.concatenate(chunks)).all() for chunks in out.values())
    [row] = fidelity(models, voices, [utterance(60, i) for i in range(3)],
                     {precision: {"precision": precision}},
                     {"max_streams": 3, "micro_batch": 3, "max_prompt_frames": 300})
    assert PRECISION_TARGET_DB < row["flow_snr_db"] < float("inf")


@pytest.mark.parametrize("precision", ["fp32", "bf16-cache", "bf16"])
def test_the_graph_path_runs_every_precision_as_its_eager_solve(models, voices, precision) -> None:  # type: ignore[no-untyped-def]
    """Each graph's static buffers hold the solve's fp32 state and inputs, whatever the
    caches' or the weights' type: every graph captures, and a stream decodes through them as
    through the eager solve."""
    small = small_models(models)
    few = make_voices(small, [2.0, 3.3])
    got: dict[str, dict] = {}  # type: ignore[type-arg]
    for graphs in (False, True):
        eng = engine(small, precision=precision, max_streams=2, micro_batch=2, graph_budget=48)
        if graphs:
            eng = type(eng)(small, eng.config, graph_backend=EagerBackend())
            assert eng.warmup() > 0
        out: dict = {}  # type: ignore[type-arg]
        reasons: dict = {}  # type: ignore[type-arg]
        for i in range(2):
            eng.add_stream(f"s{i}", few[i])
            eng.push_tokens(f"s{i}", utterance(40, i), last=True)
        with fixed_nsf_noise():  # HiFT's source noise, drawn afresh by each run otherwise
            for _ in drain(eng, out, reasons):
                pass
        assert reasons == {"s0": "done", "s1": "done"}
        got[str(graphs)] = out
        if graphs:
            stats = eng.graph_stats()
            assert stats["errors"] == {} and stats["eager"] == {} and stats["replays"] > 0
    assert max_diff_by_stream(got["False"], got["True"]) <= 1e-5


def max_diff_by_stream(a: dict, b: dict) -> float:  # type: ignore[type-arg]
    return max(max_diff(a[k], b[k]) for k in a)


def test_bf16_computes_the_flow_in_bfloat16_and_leaves_the_loaded_flow_fp32(models) -> None:  # type: ignore[no-untyped-def]
    eng = engine(models, precision="bf16")
    runner = eng.runner
    for name in ("estimator", "setup_estimator"):
        est = getattr(runner, name)
        assert {t.dtype for t in (est.k, est.v, est.conv)} == {torch.bfloat16}
        assert est.compute_dtype == torch.bfloat16 and est.io_dtype == torch.float32
    assert {p.dtype for p in runner.compute_flow.parameters()} == {torch.bfloat16}
    assert runner.compute_flow.decoder.rand_noise.dtype == torch.float32  # the solver's state
    # the loaded flow is shared with the reference and other engines: untouched
    assert {p.dtype for p in models.flow.parameters()} == {torch.float32}
    assert {p.dtype for p in models.hift.parameters()} == {torch.float32}


def test_a_precision_the_engine_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16-cache, bf16"):
        EngineConfig(precision="fp16")


@pytest.mark.parametrize("graphs", [False, True])
def test_hift_runs_in_plain_fp32_when_its_tf32_is_off(models, voices, graphs) -> None:  # type: ignore[no-untyped-def]
    """``vocoder_tf32=False``: every HiFT call, eager or through its graphs, runs with TF32
    off and cuDNN off (the bounded convs) while the rest of the engine keeps TF32; the flags
    are the engine's again after it."""
    small = small_models(models)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    seen: list[tuple[bool, bool, bool]] = []

    def record(*_: object) -> None:
        backends = torch.backends
        seen.append((backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32,
                     backends.cudnn.enabled))

    hook = small.hift.register_forward_pre_hook(record)
    try:
        for vocoder_tf32, want in ((False, (False, False, False)), (True, (True, True, True))):
            seen.clear()
            eng = engine(small, tf32=True, vocoder_tf32=vocoder_tf32, max_streams=2,
                         micro_batch=2, graph_budget=48)
            if graphs:
                eng = type(eng)(small, eng.config, graph_backend=EagerBackend())
                eng.warmup()
            out: dict = {}  # type: ignore[type-arg]
            reasons: dict = {}  # type: ignore[type-arg]
            eng.add_stream("s", voices[0])
            eng.push_tokens("s", utterance(40, 0), last=True)
            for _ in drain(eng, out, reasons):
                pass
            assert reasons == {"s": "done"} and seen and set(seen) == {want}, vocoder_tf32
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.enabled
    finally:
        hook.remove()
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
