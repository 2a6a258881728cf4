"""On a GPU, at real dims: no convolution the engine can run asks for more than the bound, and
the caching allocator never fails and retries, through every conv shape at every batch, a
warm-up and a burst of cold voices, TF32 off and on.

Opt-in (``pytest -m gpu tests/runtime/test_conv_memory_gpu.py`` on a machine with CUDA): it
runs ``bench/conv_memory.py``; ``CONV_MEMORY_JSON`` keeps its figures, ``CONV_MEMORY_BATCHES``
(comma-separated) narrows the batches swept and ``CONV_MEMORY_EVERY_NTH`` the conv calls (every
Nth; 1, the default, sweeps them all), ``CAMPPLUS_ONNX`` reuses an exported CAM++, and
``CONV_MEMORY_BURST_POOL=per-voice`` sizes the burst engine's key/value pool for its own voices
(the default, ``longest``, holds every slot at the longest prompt: 62 GiB at C64 in fp32).
The whole check takes the better part of half an hour, so it also runs in parts:
``CONV_MEMORY_TF32`` (``off``, ``on``, ``both``, the default) and ``CONV_MEMORY_PARTS``
(``sweep``, ``burst``, or ``sweep,burst``, the default); each part asserts what it measured.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from minicpm_speech_runtime.bench import conv_memory
from minicpm_speech_runtime.engine.workspace import OP_MEMORY_BOUND_BYTES

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(1800),  # every conv shape at every batch, twice, and two engine bursts
    pytest.mark.skipif(not torch.cuda.is_available(), reason="measures CUDA memory; no GPU here"),
]
MAX_STREAMS = 64


def test_no_conv_asks_beyond_the_bound_and_the_allocator_never_retries(tmp_path: Path) -> None:
    out = Path(os.environ.get("CONV_MEMORY_JSON") or tmp_path / "conv-memory.json")
    tf32 = os.environ.get("CONV_MEMORY_TF32", "both")
    parts = set(os.environ.get("CONV_MEMORY_PARTS", "sweep,burst").split(","))
    assert parts <= {"sweep", "burst"}, (
        f"CONV_MEMORY_PARTS={sorted(parts)!r:.60}: sweep, burst or both")
    argv = ["--generate", "real", "--max-streams", str(MAX_STREAMS), "--json", str(out),
            "--batches", os.environ.get("CONV_MEMORY_BATCHES", ""),
            "--every-nth-length", os.environ.get("CONV_MEMORY_EVERY_NTH", "1"),
            "--burst-pool", os.environ.get("CONV_MEMORY_BURST_POOL", "longest"),
            "--tf32", tf32]
    argv += [] if "sweep" in parts else ["--skip-sweep"]
    argv += [] if "burst" in parts else ["--skip-burst"]
    if os.environ.get("CAMPPLUS_ONNX"):
        argv += ["--campplus-onnx", os.environ["CAMPPLUS_ONNX"]]
    conv_memory.main(argv)
    result = json.loads(out.read_text())
    assert result["bounded_convs"]
    if "sweep" in parts:
        assert result["shapes"]["distinct_plans"] > 100
    bound_mib = OP_MEMORY_BOUND_BYTES / 2**20
    for mode in map(conv_memory.stage_name, conv_memory.TF32_STAGES[tf32]):
        if "sweep" in parts:
            sweep = result[mode]["sweep"]
            assert sweep["ok"], (mode, sweep["over_bound_or_events"][:3])
            assert sweep["worst_extra_mib"] <= bound_mib
        if "burst" not in parts:
            continue
        burst = result[mode]["burst"]
        assert burst["warmup_events"] == {"num_ooms": 0, "num_alloc_retries": 0}, mode
        assert burst["burst_events"] == {"num_ooms": 0, "num_alloc_retries": 0}, mode
        assert burst["warmup_transient_mib"] <= bound_mib, mode
        assert burst["burst_step_transient_mib"] <= bound_mib, mode
        assert burst["graph_stats"]["captures_after_warmup"] == 0, mode
        assert burst["expandable_segments"], mode  # the serving pod's allocator settings
