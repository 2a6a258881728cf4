"""The DiT's Triton kernels compute what the torch ops they replace compute.

The kernels run in Triton's interpreter on CPU tensors (``TRITON_INTERPRET=1``, set before
Triton is imported, hence a subprocess): each kernel on awkward shapes, then one whole batched
solve with ragged rows, fused vs torch ops, output and every cache it writes. The torch-op
solve is the one the engine parity tests hold to the reference, so this closes the chain; on
the GPU the benchmark's parity stage checks the fused engine against the reference itself.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from minicpm_speech_runtime.engine import Code2WavEngine, EngineConfig
from minicpm_speech_runtime.engine.kernels import SELF_CHECK_TOLERANCE, Kernels

CHECK = Path(__file__).with_name("fused_kernels_check.py")


@pytest.mark.timeout(660)  # above its subprocess's own 600 s
def test_triton_kernels_match_torch_ops(tiny_checkpoint: Path, child_env: dict[str, str]) -> None:
    run = subprocess.run(
        [sys.executable, str(CHECK), str(tiny_checkpoint)],
        env={**child_env, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    diffs = json.loads(run.stdout.strip().splitlines()[-1])
    kernels = {"residual_norm_80", "qkv_into_cache", "attention", "norm_mish_64", "conv_taps_300"}
    kernels |= {
        "attention_packed",
        "conv_taps_packed_300",
        "packed_solve",
        "packed_solve_conv_cache",
    }
    assert kernels | {"snake", "hift_speech", "solve", "solve_conv_cache"} <= set(diffs)
    # caches kept in bfloat16 (precision "bf16-cache"): the two paths read the same stored
    # values, but a cache entry may round to the neighbouring bfloat16 when the fp32 value
    # before it differs in its last bits (one step is 1/64 between 2 and 4, 1/16 below 16)
    bf16 = {k: diffs.pop(k) for k in list(diffs) if "_bf16_cache" in k}
    velocity = {k: bf16.pop(k) for k in ("solve_bf16_cache", "packed_solve_bf16_cache")}
    assert all(v <= 1e-3 for v in velocity.values()), velocity
    assert len(bf16) == 6 and all(v <= 1 / 16 for v in bf16.values()), bf16
    # precision "bf16": the torch ops compute norms and Mish in bfloat16 where the kernels
    # compute them in fp32 and round once, so the two drift apart by bfloat16 steps (1/128
    # relative) through ten Euler steps; the fp32 solver state keeps that drift small
    narrow = {k: diffs.pop(k) for k in list(diffs) if k.endswith("_bf16") or "_bf16_" in k}
    velocity = {k: narrow.pop(k) for k in ("solve_bf16", "packed_solve_bf16")}
    assert all(v <= 2e-2 for v in velocity.values()), velocity
    assert len(narrow) == 6 and all(v <= 1 / 16 for v in narrow.values()), narrow
    # the engine's own start-up check chose these kernels (-1: it refused them)
    assert 0 <= diffs.pop("self_check") <= SELF_CHECK_TOLERANCE["fp32"]
    # torch's matmuls in TF32 (the serving default) must not make the check refuse the kernels,
    # and the check leaves the process's TF32 setting as it found it
    assert diffs.pop("chosen_under_tf32") == {"fused": True, "tf32_after": True}
    bad = {k: v for k, v in diffs.items() if not v <= 1e-5}  # NaN fails too
    assert not bad, bad


def test_kernels_are_torch_ops_where_triton_cannot_run(models) -> None:  # type: ignore[no-untyped-def]
    plain = Kernels.for_device(torch.device("cpu"), wanted=True)
    assert not plain.fused and plain.unfused_because == "no Triton on a cpu device"
    eng = Code2WavEngine(models, EngineConfig(max_streams=2, micro_batch=2))
    assert not eng.runner.estimator.kernels.fused
    assert eng.runner.estimator.kernels is eng.runner.setup_estimator.kernels


def test_kernels_that_fail_their_self_check_fall_back_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Triton present but unable to run (here: no GPU driver for a launch) must not take the
    engine down: the self-check at construction fails, the torch ops run, a warning says why."""
    import minicpm_speech_runtime.engine.kernels as kernels

    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the interpreter runs Triton kernels on the CPU")
    monkeypatch.setattr(kernels, "triton_runs_on", lambda device: True)
    with caplog.at_level(logging.WARNING, logger=kernels.__name__):
        chosen = Kernels.for_device(torch.device("cpu"), wanted=True)
    assert not chosen.fused
    assert chosen.unfused_because and chosen.unfused_because in caplog.text


def test_wrong_kernels_fail_the_self_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel that compiles but computes something else is refused too."""
    import minicpm_speech_runtime.engine.kernels as kernels

    monkeypatch.setattr(kernels, "triton_runs_on", lambda device: True)
    monkeypatch.setattr(
        kernels.Kernels, "self_check", lambda self, device, tf32=False: float("nan"), raising=True
    )
    monkeypatch.setattr(kernels.Kernels, "__init__", _plain_init)
    chosen = Kernels.for_device(torch.device("cpu"), wanted=True)
    assert not chosen.fused and "off from the torch ops" in (chosen.unfused_because or "")


def _plain_init(self: Kernels, fused: bool) -> None:
    self.fused, self.unfused_because = fused, None
