"""The attention-tile benchmark runs end to end (Triton's interpreter on CPU, tiny shapes):
every tile of its grid on both shapes, the table, and a JSON whose current tile is marked and
agrees with the others."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUN = """
import sys
sys.path.insert(0, {here!r})
from fused_kernels_check import _interpreter_scalar_loop_bounds
_interpreter_scalar_loop_bounds()
from minicpm_speech_runtime.bench import attention_tiles
sys.argv = ["attention_tiles", "--small", "--reps", "1", "--json", {out!r}]
attention_tiles.main()
"""


@pytest.mark.timeout(660)  # above its subprocess's own 600 s
def test_tile_benchmark_prints_a_table_and_writes_json(
    tmp_path: Path, child_env: dict[str, str]
) -> None:
    out = tmp_path / "tiles.json"
    code = RUN.format(here=str(Path(__file__).parent), out=str(out))
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**child_env, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "shape" in run.stdout and "(current)" in run.stdout
    doc = json.loads(out.read_text())
    for shape in ("setup", "decode"):
        rows = doc["shapes"][shape]["rows"]
        assert len(rows) == 2 and sum(r["current"] for r in rows) == 1
        assert all(r["ms"] > 0 and r["max_diff"] <= 1e-4 for r in rows)
