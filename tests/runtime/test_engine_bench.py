"""The benchmark command end to end at tiny dims on CPU: engine and reference at one
concurrency, the table, the JSON and the plot a GPU run commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(
        [sys.executable, "-m", "minicpm_speech_runtime.bench.engine_bench", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_bench_writes_table_json_and_plot(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    run = _bench(
        "--checkpoint", str(tiny_checkpoint), "--conc", "2", "--ref-conc", "2",
        "--window", "0.5", "--ref-window", "4", "--voices", "2", "--skip", "parity,burst",
        "--git-rev", "test", "--json", str(out), "--png", str(png),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert "parity" not in doc and "setup_burst_32" not in doc  # skipped as asked
    engine, reference = doc["engine"]["2"], doc["reference"]["2"]
    assert engine["audio_s_per_s"] > 0 and engine["cuda_graph_captures_after_warmup"] == 0
    assert reference["audio_s_per_s"] > 0
    ratio = doc["ratio_audio_s_per_s"]["2"]
    assert ratio == engine["audio_s_per_s"] / reference["audio_s_per_s"]
    assert doc["git_revision"] == "test" and png.stat().st_size > 10_000
    assert "engine       2" in run.stdout and "reference    2" in run.stdout


def test_bench_names_the_stages_it_can_skip(tmp_path: Path) -> None:
    run = _bench("--generate", "tiny", "--skip", "warmup", "--json", str(tmp_path / "x.json"))
    assert run.returncode == 2 and "['burst', 'parity']" in run.stderr
