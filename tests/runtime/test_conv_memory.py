"""The conv-memory bench finds every convolution the engine runs, and the engine runs fp32
convolutions on the bounded path. The bound itself is measured on a GPU
(``test_conv_memory_gpu.py``, ``bench/conv_memory.py``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from minicpm_speech_contract.allocator import ALLOC_CONF, ALLOC_CONF_ENV, ALLOC_CONF_ENV_NEW
from minicpm_speech_runtime.bench.conv_memory import (
    SweepRow,
    burst_prompt_tokens,
    conv_calls,
    distinct_plans,
    plan_key,
    pool_mib_for,
    random_voice,
    sweep_summary,
)
from minicpm_speech_runtime.bench.conv_memory import _conv_modules as conv_modules
from minicpm_speech_runtime.bench.parity import (
    drain,
    engine,
    make_voices,
    small_models,
    utterance,
)
from minicpm_speech_runtime.engine.config import LOOKAHEAD_TOKENS
from minicpm_speech_runtime.engine.vocoder import GRAPH_SHAPES, TAIL_SHAPES
from minicpm_speech_runtime.engine.workspace import (
    OP_MEMORY_BOUND_BYTES,
    bounded_convs,
    use_serving_allocator,
)

PROMPT_FRAMES = 24  # prompts of 2 to 12 tokens


@pytest.fixture(scope="module")
def calls(models):  # type: ignore[no-untyped-def]
    return conv_calls(small_models(models), PROMPT_FRAMES, tf32=False)


def _lengths(calls, module: str) -> set[int]:  # type: ignore[no-untyped-def]
    return {c.length for c in calls if c.module == module}


def test_every_conv_the_engine_runs_is_found_at_every_length_it_runs(models, calls) -> None:  # type: ignore[no-untyped-def]
    small = small_models(models)
    found = {c.module for c in calls}
    hift = {m for m in conv_modules(small) if m.startswith("hift.")}
    assert hift <= found  # HiFT runs all its convs on every chunk
    lookahead = "flow.encoder.pre_lookahead_layer.conv1"
    assert {lookahead, "flow.encoder.up_layer.conv"} <= found
    # the DiT's causal convs are the engine's own GEMMs: no conv module of the estimator runs
    assert not any(".decoder." in m for m in found)
    # the lookahead conv reads a prompt's tokens and its lookahead: every prompt length
    prompts = {t + LOOKAHEAD_TOKENS for t in range(2, PROMPT_FRAMES // small.up_rate + 1)}
    assert prompts <= _lengths(calls, lookahead)
    # HiFT's first conv reads the mel frames of every vocoder shape (first, continuing and
    # last chunks) and of one-chunk utterances down to one token (2 frames)
    shapes = {frames for frames, _ in GRAPH_SHAPES} | {frames for frames, _ in TAIL_SHAPES}
    assert _lengths(calls, "hift.conv_pre") == shapes | set(range(2, min(shapes), 2))


def test_convs_alike_in_all_cudnn_reads_are_swept_once(models, calls) -> None:  # type: ignore[no-untyped-def]
    small = small_models(models)
    modules = conv_modules(small)
    plans = distinct_plans(small, calls)
    keys = [plan_key(modules[c.module], c.length) for c in plans]
    assert len(plans) < len(calls) and len(set(keys)) == len(keys)
    assert {plan_key(modules[c.module], c.length) for c in calls} == set(keys)


def _row(**kw: int) -> SweepRow:
    base = dict(module="m", kind="Conv1d", channels=8, length=16, batch=1, extra_bytes=0,
                num_ooms=0, num_alloc_retries=0, first_call_ms=1.0)
    return SweepRow(**(base | kw))  # type: ignore[arg-type]


def test_the_sweep_fails_a_call_over_the_bound_or_one_the_allocator_retried() -> None:
    ok = [_row(batch=b, extra_bytes=b << 20) for b in (1, 2, 64)]
    assert sweep_summary(ok, OP_MEMORY_BOUND_BYTES)["ok"]
    spike = _row(batch=24, extra_bytes=133 << 30)
    over = sweep_summary([*ok, spike], OP_MEMORY_BOUND_BYTES)
    assert not over["ok"] and over["worst"]["batch"] == 24
    assert over["over_bound_or_events_count"] == 1
    retried = sweep_summary([*ok, _row(batch=20, num_ooms=1, num_alloc_retries=1)],
                            OP_MEMORY_BOUND_BYTES)
    assert not retried["ok"] and retried["num_ooms"] == 1
    with pytest.raises(ValueError, match="no conv calls"):
        sweep_summary([], OP_MEMORY_BOUND_BYTES)


def _cudnn_state_in_convs(models, tf32: bool, bounded: bool = True) -> set[bool]:  # type: ignore[no-untyped-def]
    """Whether cuDNN was on in each conv call of one engine stream's life."""
    small = small_models(models)
    eng = engine(small, tf32=tf32, bounded_convs=bounded)
    seen: set[bool] = set()
    handles = [m.register_forward_pre_hook(lambda *_: seen.add(torch.backends.cudnn.enabled))
               for m in conv_modules(small).values()]
    try:
        eng.add_stream("s", make_voices(small, [1.0])[0])
        eng.push_tokens("s", utterance(30, 0), last=True)
        for _ in drain(eng, {}, {}):
            pass
    finally:
        for h in handles:
            h.remove()
    return seen


def test_the_engine_runs_fp32_convs_without_cudnn_and_tf32_convs_with_it(models) -> None:  # type: ignore[no-untyped-def]
    assert _cudnn_state_in_convs(models, tf32=False) == {False}
    assert _cudnn_state_in_convs(models, tf32=True) == {True}
    assert _cudnn_state_in_convs(models, tf32=False, bounded=False) == {True}
    assert torch.backends.cudnn.enabled  # and it is back on between steps


def test_the_bound_is_lifted_even_when_the_step_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), bounded_convs(fp32=True):
        assert not torch.backends.cudnn.enabled
        raise RuntimeError("boom")
    assert torch.backends.cudnn.enabled


def test_the_one_matmul_per_tap_policy_computes_the_convolution() -> None:
    from minicpm_speech_runtime.bench.conv_policies import _gemm_conv

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 16, 40, generator=g), torch.randn(8, 16, 5, generator=g)
    assert torch.allclose(_gemm_conv(x, w), torch.nn.functional.conv1d(x, w), atol=1e-5)


def test_a_per_voice_burst_pool_admits_every_burst_voice_at_once_in_less_than_every_slot(
    models,  # type: ignore[no-untyped-def]
) -> None:
    eng = engine(models, max_streams=16, micro_batch=8, tf32=True)
    top = eng.config.max_prompt_frames // models.up_rate
    prompts = burst_prompt_tokens(16, top)
    assert prompts[0] == 75 and prompts[-1] == top and prompts == sorted(prompts)
    every_slot = eng.runner.pool.capacity
    pooled = engine(models, max_streams=16, micro_batch=8, tf32=True,
                    cache_mib=pool_mib_for(models, eng.config, prompts))
    assert pooled.runner.pool.capacity < every_slot
    for i, tokens in enumerate(prompts):
        voice = random_voice(f"b{i}", tokens, models.up_rate, i)
        assert pooled.admits(voice), i
        pooled.add_stream(i, voice)
    assert pooled.num_streams == 16


def test_a_bench_runs_with_the_serving_pods_allocator_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a bench measures is what the pod runs: the allocator's settings come from one
    owner, set before CUDA starts, and a choice made in the environment is kept."""
    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    monkeypatch.delenv(ALLOC_CONF_ENV_NEW, raising=False)
    use_serving_allocator()
    assert os.environ[ALLOC_CONF_ENV] == os.environ[ALLOC_CONF_ENV_NEW] == ALLOC_CONF
    monkeypatch.delenv(ALLOC_CONF_ENV)
    monkeypatch.setenv(ALLOC_CONF_ENV_NEW, "expandable_segments:False")
    use_serving_allocator()
    assert os.environ[ALLOC_CONF_ENV_NEW] == "expandable_segments:False"
    assert ALLOC_CONF_ENV not in os.environ


def _fake_stages(monkeypatch: pytest.MonkeyPatch, fail_at: str = "") -> list[str]:
    """The bench's GPU stages replaced by recorders (their figures need CUDA); ``fail_at``
    makes that stage raise, as a command killed at its time limit would stop there."""
    from minicpm_speech_runtime.bench import conv_memory

    ran: list[str] = []
    call = conv_memory.ConvCall("flow.encoder.up_layer.conv", "Conv1d", 4, 8)
    row = SweepRow(call.module, call.kind, 4, 8, 1, 0, 0, 0, 0.1)

    def stage(name: str, result: object, tf32_at: int | None = None) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            label = name if tf32_at is None else f"{name}:{'on' if args[tf32_at] else 'off'}"
            if label == fail_at:
                raise KeyboardInterrupt(label)
            ran.append(label)
            return result
        return run

    monkeypatch.setattr(conv_memory, "conv_calls", stage("shapes", [call]))
    monkeypatch.setattr(conv_memory, "distinct_plans", lambda models, calls: calls)
    monkeypatch.setattr(conv_memory, "sweep", stage("sweep", [row], tf32_at=3))
    monkeypatch.setattr(conv_memory, "burst", stage("burst", {"burst_events": {}}, tf32_at=2))
    return ran


def test_each_finished_stage_is_saved_before_the_next_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU command cut short at its time limit keeps every stage it finished."""
    from minicpm_speech_runtime.bench import conv_memory

    ran = _fake_stages(monkeypatch, fail_at="burst:on")
    saved: list[dict[str, object]] = []
    with pytest.raises(KeyboardInterrupt):
        conv_memory.run(None, 4, 24, [1], OP_MEMORY_BOUND_BYTES,  # type: ignore[arg-type]
                        save=lambda out: saved.append(json.loads(json.dumps(out))))
    assert ran == ["shapes", "sweep:off", "burst:off", "sweep:on"]
    last = saved[-1]
    assert set(last) == {"shapes", "tf32_off", "tf32_on"}
    assert set(last["tf32_off"]) == {"sweep", "burst"}  # type: ignore[arg-type]
    assert set(last["tf32_on"]) == {"sweep"}  # type: ignore[arg-type]
    assert [sorted(s) for s in saved] == [  # one save per finished stage, none after the kill
        ["shapes"], ["shapes", "tf32_off"], ["shapes", "tf32_off"],
        ["shapes", "tf32_off", "tf32_on"]]


def test_the_sweep_and_the_bursts_run_as_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole check, over one command's GPU time, splits into parts by TF32 and stage."""
    from minicpm_speech_runtime.bench import conv_memory

    ran = _fake_stages(monkeypatch)
    out = conv_memory.run(None, 4, 24, [1], OP_MEMORY_BOUND_BYTES,  # type: ignore[arg-type]
                          with_sweep=False, tf32_modes=conv_memory.TF32_STAGES["on"])
    assert ran == ["burst:on"] and set(out) == {"tf32_on"}
    ran.clear()
    out = conv_memory.run(None, 4, 24, [1], OP_MEMORY_BOUND_BYTES,  # type: ignore[arg-type]
                          with_burst=False, tf32_modes=conv_memory.TF32_STAGES["off"])
    assert ran == ["shapes", "sweep:off"] and set(out) == {"shapes", "tf32_off"}


def test_a_run_that_would_measure_nothing_is_refused_before_it_loads_a_model(
    tmp_path: Path,
) -> None:
    from minicpm_speech_runtime.bench import conv_memory

    with pytest.raises(SystemExit, match="leave nothing to measure"):
        conv_memory.main(["--skip-sweep", "--skip-burst", "--json", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()
