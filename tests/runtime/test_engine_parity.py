"""Batched engine PCM == the reference's per-stream ``Token2wav.stream``, fp32, TF32 off.

Voices of 2.0-5.6 s (100-280 prompt frames), shared and distinct; utterances of 5-260 tokens
(one chunk to ten, past the 100-frame history window); streams joining and leaving mid-flight;
setup groups split by the micro-batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from minicpm_speech_runtime.bench.parity import (
    TOL,
    drain,
    engine,
    fixed_nsf_noise,
    make_voices,
    max_diff,
    reference_chunks,
    small_models,
    utterance,
)
from minicpm_speech_runtime.bench.reference_driver import ReferenceDriver


@pytest.fixture()
def nsf():  # type: ignore[no-untyped-def]
    with fixed_nsf_noise():
        yield


@pytest.fixture(scope="module")
def setup(models):  # type: ignore[no-untyped-def]
    small = small_models(models)
    return small, make_voices(small, [2.0, 3.3, 5.6])


def test_mixed_streams_join_and_leave(setup, nsf) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    plan = [  # (stream, voice, tokens, joins at step)
        ("a", 0, 260, 0),
        ("b", 1, 77, 0),
        ("c", 0, 5, 1),
        ("d", 2, 130, 2),
        ("e", 1, 53, 4),
    ]
    driver = ReferenceDriver(small)
    want = {
        sid: reference_chunks(driver, sid, voices[v], utterance(n, i))
        for i, (sid, v, n, _) in enumerate(plan)
    }
    eng = engine(small)
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    for step in drain(eng, got, reasons, min_steps=5):
        for i, (sid, v, n, at) in enumerate(plan):
            if at == step:
                eng.add_stream(sid, voices[v])
                eng.push_tokens(sid, utterance(n, i), last=True)
    for sid, *_ in plan:
        assert reasons[sid] == "done"
        assert max_diff(want[sid], got[sid]) <= TOL, sid
    assert eng.counters.ended["done"] == len(plan)
    assert eng.runner.num_live == 0


def test_tokens_arriving_in_pieces_and_setup_groups(setup, nsf) -> None:  # type: ignore[no-untyped-def]
    small, voices = setup
    sids = [f"s{i}" for i in range(5)]
    toks = {sid: utterance(40 + 9 * i, 10 + i) for i, sid in enumerate(sids)}
    driver = ReferenceDriver(small)
    want = {
        sid: reference_chunks(driver, sid, voices[i % 3], toks[sid]) for i, sid in enumerate(sids)
    }
    eng = engine(small, micro_batch=2)
    for i, sid in enumerate(sids):
        eng.add_stream(sid, voices[i % 3])
    got: dict[Any, list[np.ndarray]] = {}
    reasons: dict[Any, str] = {}
    sent = dict.fromkeys(sids, 0)
    for _ in drain(eng, got, reasons):
        for sid in sids:  # 7 tokens per stream per step, the last flag with the final piece
            if sid in eng.scheduler.streams and sent[sid] < len(toks[sid]):
                piece = toks[sid][sent[sid] : sent[sid] + 7]
                sent[sid] += len(piece)
                eng.push_tokens(sid, piece, last=sent[sid] >= len(toks[sid]))
    assert eng.counters.setup_groups == 3 and eng.counters.setups == 5
    for sid in sids:
        assert max_diff(want[sid], got[sid]) <= TOL, sid
