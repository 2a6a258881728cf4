"""The fidelity bench can tell a right engine from a wrong one: the same arithmetic scores
infinite, fewer solver steps a finite figure, and a kernel that drops its residual far below the
30 dB that a reduced-precision mode has to reach."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from minicpm_speech_runtime.bench.fidelity import (
    Energy,
    Stream,
    compare,
    default_engine,
    fidelity,
    parse_candidate,
    summarize,
)
from minicpm_speech_runtime.bench.parity import make_voices, utterance

PRECISION_TARGET_DB = 30.0  # what a reduced-precision flow must keep against fp32
BASE = {"max_streams": 3, "micro_batch": 3, "max_prompt_frames": 300}


@pytest.fixture(scope="module")
def streams(models):  # type: ignore[no-untyped-def]
    return make_voices(models, [1.0, 1.5, 2.0]), [utterance(60, i) for i in range(3)]


def _dropped_residual(models, overrides: dict[str, Any]):  # type: ignore[no-untyped-def]
    """An engine whose residual-and-norm kernel forgets the residual stream."""
    eng = default_engine(models, overrides)
    kernels = eng.runner.kernels
    right = kernels.residual_norm

    def wrong(x, gate, y, norm, eps):  # type: ignore[no-untyped-def]
        return right(x if y is None else torch.zeros_like(x), gate, y, norm, eps)

    kernels.residual_norm = wrong
    return eng


def test_the_same_engine_scores_infinite_and_fewer_steps_a_finite_figure(models, streams) -> None:  # type: ignore[no-untyped-def]
    voices, utterances = streams
    # a pool of 5 MiB holds the two shorter streams; the third waits until both are done
    same, steps5, pooled = fidelity(
        models, voices, utterances,
        {"same": {}, "steps5": {"n_timesteps": 5}, "pooled": {"cache_mib": 5}}, BASE)
    assert same["streams"] == pooled["streams"] == 3
    assert all(same[k] == float("inf") for k in ("flow_snr_db", "mel_snr_db", "pcm_snr_db"))
    # the waiting stream decodes alone: other batch shapes, float noise only
    assert all(pooled[k] > 100 for k in ("flow_snr_db", "mel_snr_db", "pcm_snr_db"))
    assert same["worst_flow_l1"] == same["worst_mel_l1"] == 0.0
    assert PRECISION_TARGET_DB < steps5["flow_snr_db"] < float("inf")
    assert steps5["worst_stream_flow_snr_db"] <= steps5["flow_snr_db"]
    assert steps5["worst_flow_l1"] > 0


def test_a_kernel_that_drops_the_residual_scores_far_below_the_target(models, streams) -> None:  # type: ignore[no-untyped-def]
    voices, utterances = streams
    [wrong] = fidelity(models, voices, utterances, {"dropped-residual": {}}, BASE,
                       make=_dropped_residual)
    assert wrong["flow_snr_db"] < PRECISION_TARGET_DB - 20
    assert wrong["worst_flow_l1"] > 0.05


def test_streams_of_different_lengths_or_none_are_refused() -> None:
    a = Stream(np.zeros((80, 4), np.float32), np.zeros(100, np.float32))
    b = Stream(np.zeros((80, 5), np.float32), np.zeros(100, np.float32))
    with pytest.raises(ValueError, match="shapes differ"):
        compare(a, b)
    with pytest.raises(ValueError, match="no streams"):
        summarize([])
    e = Energy.between(np.ones(4), np.ones(4) * 1.1)
    assert e.signal == 4 and abs(e.error - 0.04) < 1e-9 and abs(e.l1 - 0.1) < 1e-9


def test_a_candidate_names_engine_fields_only() -> None:
    assert parse_candidate("steps5:n_timesteps=5,tf32=1") == (
        "steps5", {"n_timesteps": 5, "tf32": True})
    with pytest.raises(SystemExit, match="'precisionx' is no EngineConfig field"):
        parse_candidate("x:precisionx=1")
    with pytest.raises(SystemExit, match="give it a name"):
        parse_candidate(":n_timesteps=5")
