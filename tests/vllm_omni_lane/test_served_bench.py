"""The served-path benchmark end to end at tiny dims on CPU, on vLLM-Omni's own stage-2 model:
the plugin on (in ``bf16``, set as a profile sets it), vLLM-Omni's own backend and the engine
driven directly, one row per C, the JSON and the plot a GPU run commits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "vllm_omni", reason="vLLM-Omni is not installed here; `make test-vllm-omni` runs this lane"
)


@pytest.mark.timeout(1200)
def test_bench_compares_the_three_paths(tmp_path: Path) -> None:
    out, png = tmp_path / "served.json", tmp_path / "served.png"
    run = subprocess.run(
        [sys.executable, "-m", "minicpm_speech_runtime.bench.served_bench", "--generate", "tiny",
         "--workdir", str(tmp_path / "work"), "--conc", "2", "--own-conc", "2",
         "--window", "0.5", "--voices", "2", "--git-rev", "test", "--json", str(out),
         "--png", str(png), "--served-extra", "token2wav_precision=bf16"],
        capture_output=True, text=True, timeout=1100,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    [row] = doc["rows"]
    assert row["concurrency"] == 2
    for key in ("served_audio_s_per_s", "engine_audio_s_per_s", "vllm_omni_audio_s_per_s"):
        assert row[key] > 0, (key, doc)
    assert row["engine_steps_per_forward"] == 1.0  # the engine's own counter, every forward
    assert doc["served"]["2"]["backend"] == "Code2WavBackend"
    # the extra reached the engine the plugin built inside vLLM-Omni's stage 2
    assert doc["served_extras"]["token2wav_precision"] == "bf16"
    assert doc["served"]["2"]["engine_config"]["precision"] == "bf16"
    assert doc["vllm_omni"]["2"]["backend"] == "BatchedToken2Wav"
    # the weights held once: the engine's, after vLLM-Omni's backend was let go
    assert row["code2wav_weight_gib"] > 0 and row["vllm_omni_weights_freed_gib"] > 0
    assert doc["vllm_stand_ins"] == []  # vLLM is installed in this lane
    assert png.stat().st_size > 10_000
    assert "stand-ins: none" in run.stdout
