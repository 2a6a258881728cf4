"""Caches sized per voice: a stream takes the estimator frames its own prompt needs from a pool
of ``cache_mib``, waits when the pool cannot hold it yet, and decodes the reference's PCM in
frames a finished stream left behind."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from minicpm_speech_contract.extras import DIT_ATTENTION_WIDTH, DIT_BLOCKS, kv_frame_bytes
from minicpm_speech_runtime.bench.parity import (
    TOL,
    engine,
    fixed_nsf_noise,
    make_voices,
    max_diff,
    reference_chunks,
    small_models,
    step_once,
    utterance,
)
from minicpm_speech_runtime.bench.reference_driver import ReferenceDriver
from minicpm_speech_runtime.engine.runner import kv_frame_nbytes
from minicpm_speech_runtime.fixtures.checkpoint import REAL


@pytest.fixture(scope="module")
def setup(models: Any) -> Any:
    small = small_models(models)
    return small, make_voices(small, [1.0, 3.0, 2.0])


def test_a_full_pool_holds_a_stream_back_until_one_leaves_with_parity(setup: Any) -> None:
    small, (short, long, middle) = setup
    eng = engine(small, cache_mib=5)
    runner = eng.runner
    per_frame = kv_frame_nbytes(runner.compute_flow, eng.config)
    assert runner.pool.capacity == 5 * 2**20 // per_frame  # not 6 slots of the longest prompt
    assert runner.estimator.k.shape[2] == 2 * 6 + runner.pool.capacity  # the rows' trash on top
    need = {id(v): 2 * eng.config.stream_frames(int(v.prompt_mels.shape[1])) for v in setup[1]}
    assert need[id(short)] + need[id(long)] <= runner.pool.capacity
    assert need[id(short)] + need[id(long)] + need[id(middle)] > runner.pool.capacity

    plan = {"s": (short, utterance(40, 1)), "l": (long, utterance(90, 2)),
            "m": (middle, utterance(60, 3))}
    for sid in ("s", "l"):
        assert eng.admits(plan[sid][0])
        eng.add_stream(sid, plan[sid][0])
        eng.push_tokens(sid, plan[sid][1], last=True)
    assert eng.free_slots == 4 and not eng.admits(middle)  # slots to spare, frames not
    with pytest.raises(RuntimeError, match="no free cache frames"):
        eng.add_stream("m", middle)
    assert eng.num_streams == 2 and runner.pool.available < need[id(middle)]

    held = {sid: set(runner.streams[sid].pool_frames) for sid in ("s", "l")}
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    waited = 0
    with fixed_nsf_noise():
        while len(reasons) < len(plan):
            if "m" not in eng.scheduler.streams and "m" not in reasons:
                if eng.admits(middle):
                    eng.add_stream("m", middle)
                    eng.push_tokens("m", plan["m"][1], last=True)
                    # it decodes in frames the streams before it wrote, stale keys and all
                    assert set(runner.streams["m"].pool_frames) & (held["s"] | held["l"])
                else:
                    waited += 1
            step_once(eng, got, reasons)
        driver = ReferenceDriver(small)
        want = {sid: reference_chunks(driver, sid, v, toks) for sid, (v, toks) in plan.items()}
    assert waited > 0 and reasons == {"s": "done", "l": "done", "m": "done"}
    for sid in plan:
        assert max_diff(want[sid], got[sid]) <= TOL, sid
    assert runner.pool.available == runner.pool.capacity  # every frame came back


def test_a_budget_below_the_longest_prompt_is_refused_with_the_least_that_fits(models: Any) -> None:
    with pytest.raises(ValueError, match=r"cache_mib 1 .* at least 5 MiB \(token2wav_cache_mib\)"):
        engine(models, cache_mib=1)
    roomy = engine(models, cache_mib=10**5)  # more than every slot can use is not allocated
    assert roomy.runner.pool.capacity == 6 * 2 * roomy.config.stream_frames(300)


def test_the_contract_prices_a_frame_as_the_engine_does_at_real_dims() -> None:
    """The profile check (``token2wav_cache_mib`` against the longest prompt) and the engine's
    pool size agree on what a frame costs of MiniCPM-o 4.5's DiT."""
    assert (REAL.dit_depth, REAL.dit_heads * REAL.dit_head_dim) == (DIT_BLOCKS, DIT_ATTENTION_WIDTH)
    assert kv_frame_bytes(10, "fp32") == 655_360  # 1.31 MB per frame of a stream's two rows
    assert kv_frame_bytes(10, "bf16-cache") == kv_frame_bytes(10, "bf16") == 327_680


def test_the_least_pool_the_profile_rules_accept_is_the_least_the_engine_builds() -> None:
    """The profile check and the engine refuse the same budgets at real dims."""
    from minicpm_speech_contract.extras import DEFAULTS
    from minicpm_speech_runtime.engine import EngineConfig
    from minicpm_speech_runtime.engine.runner import kv_pool_frames

    least, frame = DEFAULTS.cache_mib_needed(), kv_frame_bytes(10, "fp32")
    assert kv_pool_frames(EngineConfig(cache_mib=least), frame) >= 2 * 656
    with pytest.raises(ValueError, match=f"at least {least} MiB"):
        kv_pool_frames(EngineConfig(cache_mib=least - 1), frame)
