"""The benchmark command end to end at tiny dims on CPU: engine and reference at one
concurrency, the table, the JSON and the plot a GPU run commits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def _bench(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minicpm_speech_runtime.bench.engine_bench", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.timeout(960)  # above its subprocess's own 900 s
def test_bench_writes_table_json_and_plot(
    tiny_checkpoint: Path, tmp_path: Path, child_env: dict[str, str]
) -> None:
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    run = _bench(
        child_env,
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


def test_bench_names_the_stages_it_can_skip(tmp_path: Path, child_env: dict[str, str]) -> None:
    out = str(tmp_path / "x.json")
    run = _bench(child_env, "--generate", "tiny", "--skip", "warmup", "--json", out)
    assert run.returncode == 2 and "['burst', 'parity']" in run.stderr


def test_the_closed_loop_can_start_every_stream_as_vllm_omni_does() -> None:
    """The served bench's engine rows decode the token streams its served rows decode: with a
    prefix of vLLM-Omni's 3 silence codes, a stream is those codes and its 250 tokens, pushed
    28 first and 25 a step, and its last push is the one that completes all 253."""
    from dataclasses import dataclass

    from minicpm_speech_runtime.bench.engine_bench import UTT_TOKENS, Loop
    from minicpm_speech_runtime.bench.parity import utterance

    @dataclass
    class Voice:
        key: str

    silence = (4218, 4218, 4218)
    for prefix in ((), silence):
        loop = Loop(voices=[Voice("v")], conc=1, prefix=prefix)
        sid, _ = loop.new_stream()
        pieces, last = [], False
        while not last:
            toks, last = loop.piece(sid)
            pieces.append(toks)
        assert [len(p) for p in pieces[:2]] == [28, 25]
        assert [t for p in pieces for t in p] == list(prefix) + utterance(UTT_TOKENS, sid)
        # 250 tokens end on a 25-token chunk (22 pushed + 3 held); 253 on a 28-token one
        assert len(pieces[-1]) == (22 if not prefix else 25)


def test_a_bench_builds_an_engine_only_once_the_last_one_is_gone(models) -> None:  # type: ignore[no-untyped-def]
    """An engine's graph closures make reference cycles; a sweep of concurrencies must not
    hold the last engine's caches while it builds the next (C128 beside C64 did not fit)."""
    import gc
    import weakref

    from minicpm_speech_runtime.bench.engine_bench import new_engine
    from minicpm_speech_runtime.engine import EngineConfig

    cfg = EngineConfig(max_streams=2, micro_batch=2, max_prompt_frames=300, tf32=False)
    first = new_engine(models, cfg)
    first.runner.owner_engine = first  # type: ignore[attr-defined]  # a cycle, as closures make
    gone = weakref.ref(first)
    del first
    gc.disable()  # no collection but the one the bench itself asks for
    try:
        assert gone() is not None
        second = new_engine(models, cfg)
        assert gone() is None and second.free_slots == 2
    finally:
        gc.enable()
