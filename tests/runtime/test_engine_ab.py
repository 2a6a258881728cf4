"""The side-by-side benchmark runs each variant from its own tree, with its own overrides, in
alternating order, one process per run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import minicpm_speech_runtime
import pytest
from minicpm_speech_runtime.bench.engine_ab import parse_variants, run_order

HERE = Path(minicpm_speech_runtime.__file__).resolve().parents[1]


def test_each_round_reverses_the_order_of_the_one_before() -> None:
    assert run_order(["a", "b"], 3) == ["a", "b", "b", "a", "a", "b"]
    assert run_order(["a", "b", "c"], 2) == ["a", "b", "c", "c", "b", "a"]


def test_variant_specs_name_the_fix(tmp_path: Path) -> None:
    def message(specs: list[str], sets: list[str] = []) -> str:  # noqa: B006
        with pytest.raises(SystemExit) as exc:
            parse_variants(specs, sets, HERE)
        return str(exc.value)

    assert "holds no minicpm_speech_runtime" in message(["a", f"b={tmp_path}"])
    assert "a name of its own" in message(["a", "a"])
    assert "at least two" in message(["a"])
    assert "VARIANT:FIELD=VALUE" in message(["a", "b"], ["c:micro_batch=1"])
    variants = parse_variants(["a", "b"], ["b:micro_batch=1", "b:note=x"], HERE)
    assert variants[1].overrides == {"micro_batch": 1, "note": "x"}


@pytest.mark.timeout(660)  # above its subprocess's own 600 s
def test_variants_run_from_their_own_trees_with_their_overrides(
    tiny_checkpoint: Path, tmp_path: Path, child_env: dict[str, str]
) -> None:
    other = tmp_path / "other"
    shutil.copytree(HERE / "minicpm_speech_runtime", other / "minicpm_speech_runtime")
    config = other / "minicpm_speech_runtime" / "engine" / "config.py"
    text = config.read_text()
    # a field the bench leaves to the engine's default
    default = "    idle_timeout_s: float = 30.0\n"
    assert default in text
    config.write_text(text.replace(default, "    idle_timeout_s: float = 7.0\n"))
    out = tmp_path / "ab.json"
    args = ["--checkpoint", str(tiny_checkpoint), "--conc", "2", "--window", "0.3"]
    args += ["--rounds", "1", "--voices", "1", "--json", str(out)]
    args += ["--variant", "here", "--variant", f"other={other}", "--set", "here:micro_batch=1"]
    run = subprocess.run(
        [sys.executable, "-m", "minicpm_speech_runtime.bench.engine_ab", *args],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["order"] == ["here", "other"]
    runs = {r["variant"]: r for r in doc["runs"]}
    assert all(r["audio_s_per_s"] > 0 for r in runs.values()), runs
    # the override reaches only its variant; the other tree's own default reaches only it
    assert (runs["here"]["config"]["micro_batch"], runs["here"]["config"]["idle_timeout_s"]) == (
        1,
        30.0,
    )
    assert (runs["other"]["config"]["micro_batch"], runs["other"]["config"]["idle_timeout_s"]) == (
        2,
        7.0,
    )
    summary = {row["variant"]: row for row in doc["summary"]}
    assert summary["here"]["vs_first"] == 1.0 and summary["other"]["vs_first"] > 0
    assert "vs first" in run.stdout
