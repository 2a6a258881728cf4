"""The precision benchmark end to end at tiny dims on CPU: every mode at every concurrency, its
fidelity against fp32, the table, the JSON rows and the plot a GPU run commits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from minicpm_speech_runtime.bench import precision_bench
from minicpm_speech_runtime.bench.precision_bench import ROW_FIELDS


@pytest.mark.timeout(600)
def test_every_mode_gets_a_row_per_concurrency_with_its_fidelity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "precision.json", tmp_path / "precision.png"
    precision_bench.main([
        "--generate", "tiny", "--conc", "1,2", "--window", "0.3", "--voices", "2",
        "--fidelity-voices", "2", "--fidelity-tokens", "40", "--mode", "fp32:conc=2",
        "--mode", "bf16-cache:precision=bf16-cache,n_timesteps=5,conc=2",
        "--mode", "fp32-pool:pool_prompt_s=mean",
        "--git-rev", "test", "--json", str(out), "--png", str(png),
    ])  # fmt: skip
    doc = json.loads(out.read_text())
    rows = doc["rows"]
    # a mode's own ``conc`` narrows --conc; the others run at every C
    assert [(r["mode"], r["concurrency"]) for r in rows] == [
        ("fp32", 2), ("bf16-cache", 2), ("fp32-pool", 1), ("fp32-pool", 2)]
    assert all(set(r) == set(ROW_FIELDS) for r in rows)
    fp32, bf16, _, pooled = rows
    assert fp32["flow_snr_db"] == "inf"  # the reference itself: identical
    assert (bf16["precision"], bf16["n_timesteps"]) == ("bf16-cache", 5)
    assert bf16["flow_snr_db"] < 100  # five steps: a real change
    # the worst stream beside the whole run: the reference scores no error, a change scores one
    assert fp32["worst_mel_l1"] == 0 and bf16["worst_mel_l1"] > 0
    assert bf16["worst_stream_mel_snr_db"] <= bf16["mel_snr_db"]
    assert all(r["audio_s_per_s"] > 0 and r["captures_after_warmup"] == 0 for r in rows)
    # the pool holds two streams of the voices' mean prompt, not two of the longest allowed
    assert fp32["cache_mib"] is None and pooled["cache_mib"] > 0
    assert pooled["estimator_cache_gib"] < fp32["estimator_cache_gib"]
    assert pooled["pcm_snr_db"] == "inf"  # the same fp32 arithmetic, read through the table
    assert png.stat().st_size > 10_000
    assert "bf16-cache" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["", "x", "0", "-1", "99"])
def test_a_pool_size_that_is_no_prompt_length_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(SystemExit, match="pool_prompt_s is seconds"):
        precision_bench.parse_mode(f"pool:pool_prompt_s={value}")


@pytest.mark.parametrize("value", ["", "x", "0", "64+", "64+x", "2000"])
def test_a_mode_concurrency_that_is_no_count_is_refused_naming_the_key(value: str) -> None:
    with pytest.raises(SystemExit, match="conc is concurrencies joined by"):
        precision_bench.parse_mode(f"fp32:conc={value}")


def test_a_mode_whose_concurrencies_are_not_in_the_sweep_is_refused_before_any_work(
    tmp_path: Path,
) -> None:
    out = tmp_path / "precision.json"
    with pytest.raises(SystemExit, match="names none of --conc 64"):
        precision_bench.main(["--generate", "tiny", "--conc", "64", "--mode", "fp32:conc=128",
                              "--json", str(out)])
    assert not out.exists()
